"""`tenure exec --metrics-textfile`: gauges about the last run, for node_exporter."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

import tenure
from tenure.exec.textfile import write_last_run
from tests.support.env import run_tenure, tenure_env


def _samples(path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(path.read_text()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_last_run_gauges_keep_the_last_success(
    client: tenure.Client, dsn: str, schema: str, tmp_path: Path
) -> None:
    env = tenure_env(dsn, schema)
    prom = tmp_path / "textfile" / "nightly.prom"
    job = (("job_key", "nightly"),)
    ok = run_tenure(
        ["exec", "--metrics-textfile", str(prom), "--key", "nightly", "--", "true"], env
    )
    assert ok.returncode == 0, ok.stderr
    first = _samples(prom)
    assert first[("tenure_exec_last_run_exit_code", job)] == 0
    assert first[("tenure_exec_last_run_outcome", (*job, ("outcome", "succeeded")))] == 1
    success_at = first[("tenure_exec_last_success_timestamp_seconds", job)]
    assert success_at == first[("tenure_exec_last_run_timestamp_seconds", job)]

    bad = run_tenure(
        ["exec", "--metrics-textfile", str(prom), "--key", "nightly", "--", "false"], env
    )
    assert bad.returncode == 1
    second = _samples(prom)
    assert second[("tenure_exec_last_run_exit_code", job)] == 1
    assert second[("tenure_exec_last_run_outcome", (*job, ("outcome", "failed")))] == 1
    assert second[("tenure_exec_last_run_outcome", (*job, ("outcome", "succeeded")))] == 0
    assert second[("tenure_exec_last_success_timestamp_seconds", job)] == success_at
    assert second[("tenure_exec_last_run_timestamp_seconds", job)] > success_at

    holder = client.acquire("nightly", ttl=60)
    assert holder is not None
    busy = run_tenure(
        ["exec", "--metrics-textfile", str(prom), "--key", "nightly", "--", "true"], env
    )
    assert busy.returncode == 0
    third = _samples(prom)
    assert third[("tenure_exec_last_run_outcome", (*job, ("outcome", "busy")))] == 1
    assert third[("tenure_exec_last_success_timestamp_seconds", job)] == success_at
    assert not list(prom.parent.glob(".*.tmp")), "temporary files left behind"


def test_database_error_is_recorded_as_error(schema: str, tmp_path: Path) -> None:
    prom = tmp_path / "x.prom"
    env = tenure_env("postgresql://postgres@127.0.0.1:1/postgres", schema)
    out = run_tenure(["exec", "--metrics-textfile", str(prom), "--key", "x", "--", "true"], env)
    assert out.returncode == 1
    samples = _samples(prom)
    assert samples[("tenure_exec_last_run_outcome", (("job_key", "x"), ("outcome", "error")))] == 1
    assert ("tenure_exec_last_success_timestamp_seconds", (("job_key", "x"),)) not in samples


def test_a_file_from_before_the_job_key_label_keeps_its_last_success(tmp_path: Path) -> None:
    """Up to 0.x the label was `job` (which node_exporter's scrape overwrites): the first run
    after the upgrade still finds the last success there, and writes `job_key` only."""
    prom = tmp_path / "nightly.prom"
    prom.write_text(
        "# TYPE tenure_exec_last_success_timestamp_seconds gauge\n"
        'tenure_exec_last_success_timestamp_seconds{job="other"} 1600000000.000\n'
        'tenure_exec_last_success_timestamp_seconds{job="nightly"} 1700000000.000\n'
    )
    write_last_run(prom, "nightly", "failed", 1, 0.5)
    samples = _samples(prom)
    assert samples[("tenure_exec_last_success_timestamp_seconds", (("job_key", "nightly"),))] == (
        1700000000.0
    )
    assert samples[("tenure_exec_last_run_exit_code", (("job_key", "nightly"),))] == 1
    assert all(dict(labels).keys() <= {"job_key", "outcome"} for _, labels in samples)

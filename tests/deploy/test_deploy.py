"""deploy/: the systemd unit, the Kubernetes manifests, the container recipe, and shell
completion, checked as far as this machine can (issue 26)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import tenure
from tenure.observability.exporter import Database
from tenure.observability.http import App

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
TENURE = Path(sys.executable).parent / "tenure"


def test_the_systemd_unit_verifies(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    unit = (DEPLOY / "systemd" / "tenure-worker.service").read_text()
    assert "ExecStart=/opt/tenure/venv/bin/tenure worker\n" in unit
    # This host's paths for the ones an operator creates: the venv, the settings, the user.
    env_file = tmp_path / "worker.env"
    env_file.write_text("TENURE_APP=myapp.jobs:app\n")
    unit = unit.replace("/opt/tenure/venv/bin/tenure", str(TENURE))
    unit = unit.replace("/etc/tenure/worker.env", str(env_file))
    unit = re.sub(r"^(User|Group)=tenure$", r"\1=root", unit, flags=re.MULTILINE)
    path = tmp_path / "tenure-worker.service"
    path.write_text(unit)
    done = subprocess.run(
        [analyze, "verify", str(path)], capture_output=True, text=True, timeout=60
    )
    # Its own lines only: on a host without systemd as init it also complains about the
    # host's units (and says so in lines that do not name ours).
    ours = [line for line in done.stderr.splitlines() if "tenure-worker" in line]
    assert ours == [], done.stderr
    broken = tmp_path / "broken" / "tenure-worker.service"
    broken.parent.mkdir()
    broken.write_text(unit.replace("KillMode=mixed", "KillMode=sometimes"))
    done = subprocess.run(
        [analyze, "verify", str(broken)], capture_output=True, text=True, timeout=60
    )
    assert "tenure-worker.service:25: Failed to parse kill mode" in done.stderr  # it can fail


def manifests() -> list[dict[str, Any]]:
    yaml = pytest.importorskip("yaml", reason="PyYAML (kubernetes-validate's) is not installed")
    found: list[dict[str, Any]] = []
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        found += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def test_the_kubernetes_manifests_validate_against_the_schemas() -> None:
    validate = pytest.importorskip("kubernetes_validate", reason="a dev tool (--group dev)")
    docs = manifests()
    assert {d["kind"] for d in docs} == {"Deployment", "CronJob"}
    version = validate.latest_version()
    for doc in docs:
        validate.validate(doc, version, strict=True)
    bad = {**docs[0], "spec": {**docs[0]["spec"], "replicas": "two"}}
    with pytest.raises(validate.ValidationError):
        validate.validate(bad, version, strict=True)


def container(doc: dict[str, Any]) -> dict[str, Any]:
    spec = (
        doc["spec"]["template"]["spec"]
        if doc["kind"] == "Deployment"
        else (doc["spec"]["jobTemplate"]["spec"]["template"]["spec"])
    )
    [only] = spec["containers"]
    return dict(only)


def test_the_workers_probes_are_the_paths_the_metrics_server_answers(
    dsn: str, client: tenure.Client
) -> None:
    [worker] = [d for d in manifests() if d["kind"] == "Deployment"]
    c = container(worker)
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert c["args"] == ["worker"] and env["TENURE_METRICS_PORT"] == "9464"
    assert c["ports"] == [{"name": "metrics", "containerPort": 9464}]
    app = App(None, Database(dsn, client.schema))
    for probe in ("livenessProbe", "readinessProbe"):
        path = c[probe]["httpGet"]["path"]
        assert c[probe]["httpGet"]["port"] == "metrics"
        statuses: list[str] = []
        app(
            {"PATH_INFO": path, "REQUEST_METHOD": "GET"}, lambda s, h, seen=statuses: seen.append(s)
        )
        assert statuses == ["200 OK"], (probe, path)


def test_the_cronjob_runs_tenure_exec_once_per_scheduled_slot() -> None:
    [cron] = [d for d in manifests() if d["kind"] == "CronJob"]
    c = container(cron)
    assert c["args"][0] == "exec" and "--" in c["args"]
    [slot] = [e for e in c["env"] if e["name"] == "TENURE_EXEC_SLOT"]
    assert slot["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['job-name']"
    # The arguments are ones `tenure exec` takes (a usage error exits 2 before connecting).
    args = c["args"][1 : c["args"].index("--")]
    done = subprocess.run(
        [str(TENURE), "exec", *args, "--dsn", "postgresql://127.0.0.1:1/x", "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr  # 1: the database is unreachable, not usage


def test_the_container_recipe() -> None:
    recipe = (DEPLOY / "container" / "Containerfile").read_text()
    assert 'ENTRYPOINT ["tenure"]' in recipe and 'CMD ["worker"]' in recipe
    assert re.search(r"^USER [1-9]\d*:", recipe, re.MULTILINE)  # never root
    assert "[binary,prometheus]" in recipe  # libpq in the wheel; /metrics, /healthz, /readyz


def test_the_container_image_builds(tmp_path: Path) -> None:
    engines = [e for e in (shutil.which("podman"), shutil.which("docker")) if e]
    running = [
        e
        for e in engines
        if subprocess.run([e, "info"], capture_output=True, timeout=60).returncode == 0
    ]
    if not running:
        pytest.skip(
            "no container engine runs here (podman or docker with a daemon): the recipe is "
            "checked statically above"
        )
    context = tmp_path / "context"
    (context / "app").mkdir(parents=True)
    (context / "dist").mkdir()
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(context / "dist"), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    recipe = str(DEPLOY / "container" / "Containerfile")
    done = subprocess.run(
        [running[0], "build", "-f", recipe, "-t", "tenure-app:test", str(context)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_shell_completion_completes_commands_and_options() -> None:
    env = {**os.environ, "_TENURE_COMPLETE": "bash_source"}
    script = subprocess.run([str(TENURE)], env=env, capture_output=True, text=True, timeout=60)
    assert script.returncode == 0 and "complete " in script.stdout, script.stderr
    assert subprocess.run(["bash", "-n"], input=script.stdout, text=True).returncode == 0

    def complete(words: str) -> list[str]:
        done = subprocess.run(
            [str(TENURE)],
            env={
                **os.environ,
                "_TENURE_COMPLETE": "bash_complete",
                "COMP_WORDS": words,
                "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1)),
            },
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return [line.split(",", 1)[1] for line in done.stdout.splitlines()]

    assert "worker" in complete("tenure wor")
    assert "--metrics-port" in complete("tenure worker --metrics-p")

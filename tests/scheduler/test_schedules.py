"""Slot maths (pure, no database): cron in time zones across DST, every-schedules, and the
claim plan (misfire policies, crash retry, triggers, slots that never run twice)."""

from __future__ import annotations

import datetime as dt
import itertools
from zoneinfo import ZoneInfo

import pytest

from tenure import InvalidArgument, Scheduler
from tenure.scheduler.schedules import (
    MAX_ATTEMPTS,
    JobState,
    Plan,
    Policy,
    Schedule,
    due_slots,
    phase_of,
    plan,
)

UTC = dt.UTC
BERLIN = ZoneInfo("Europe/Berlin")


def slots_between(schedule: Schedule, start: dt.datetime, end: dt.datetime) -> list[dt.datetime]:
    out = []
    for slot in schedule.iter_after(start):
        if slot >= end:
            return out
        out.append(slot)
    raise AssertionError("unreachable")


def berlin(*args: int) -> dt.datetime:
    return dt.datetime(*args, tzinfo=BERLIN)


# -- DST --------------------------------------------------------------------------------------


def test_spring_forward_0230_runs_once_right_after_the_gap() -> None:
    """2024-03-31 in Berlin: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist."""
    daily = Schedule.build("d", cron="30 2 * * *", timezone="Europe/Berlin")
    slots = slots_between(daily, berlin(2024, 3, 30, 12), berlin(2024, 4, 1, 12))
    local = [s.astimezone(BERLIN) for s in slots]
    assert [(t.day, t.hour, t.minute) for t in local] == [(31, 3, 0), (1, 2, 30)]
    assert slots[0] == dt.datetime(2024, 3, 31, 1, 0, tzinfo=UTC)


def test_fall_back_0230_runs_once_at_the_first_occurrence() -> None:
    """2024-10-27 in Berlin: 03:00 CEST goes back to 02:00 CET; 02:30 happens twice."""
    daily = Schedule.build("d", cron="30 2 * * *", timezone="Europe/Berlin")
    slots = slots_between(daily, berlin(2024, 10, 26, 12), berlin(2024, 10, 28, 12))
    assert slots == [
        dt.datetime(2024, 10, 27, 0, 30, tzinfo=UTC),  # 02:30 CEST, the first 02:30
        dt.datetime(2024, 10, 28, 1, 30, tzinfo=UTC),  # 02:30 CET the next day
    ]


def test_fall_back_never_goes_backwards_from_inside_the_repeated_hour() -> None:
    """Asked for the next slot at 02:45 CET (the second pass, after 02:30 CEST already ran),
    the answer is tomorrow, not 02:30 again (cronsim alone would say 02:30 CEST: earlier)."""
    daily = Schedule.build("d", cron="30 2 * * *", timezone="Europe/Berlin")
    second_pass = dt.datetime(2024, 10, 27, 1, 45, tzinfo=UTC)  # 02:45 CET
    assert daily.next_after(second_pass) == dt.datetime(2024, 10, 28, 1, 30, tzinfo=UTC)
    first_pass = dt.datetime(2024, 10, 27, 0, 15, tzinfo=UTC)  # 02:15 CEST
    assert daily.next_after(first_pass) == dt.datetime(2024, 10, 27, 0, 30, tzinfo=UTC)


def test_wildcard_hour_jobs_follow_real_time_across_dst() -> None:
    """Every 30 minutes: in the repeated hour each real instant runs, the gap has none."""
    half = Schedule.build("h", cron="*/30 * * * *", timezone="Europe/Berlin")
    fall = slots_between(
        half,
        dt.datetime(2024, 10, 26, 23, 59, tzinfo=UTC),
        dt.datetime(2024, 10, 27, 3, 1, tzinfo=UTC),
    )
    assert len(fall) == 7  # 00:00 .. 03:00 UTC every 30 minutes: real time
    assert [s.astimezone(BERLIN).strftime("%H:%M%z") for s in fall[:4]] == [
        "02:00+0200",
        "02:30+0200",
        "02:00+0100",
        "02:30+0100",
    ]
    spring = slots_between(half, berlin(2024, 3, 31, 1, 1), berlin(2024, 3, 31, 4, 1))
    assert [s.astimezone(BERLIN).strftime("%H:%M") for s in spring] == [
        "01:30",
        "03:00",
        "03:30",
        "04:00",
    ]


def test_slots_are_strictly_increasing_over_a_year_of_dst() -> None:
    for expr in ("30 2 * * *", "0 * * * *", "15 1-3 * * 0"):
        schedule = Schedule.build("y", cron=expr, timezone="Europe/Berlin")
        slots = slots_between(schedule, berlin(2024, 1, 1), berlin(2025, 1, 1))
        assert all(a < b for a, b in itertools.pairwise(slots)), expr
        assert len(set(slots)) == len(slots)


def test_cron_in_utc_and_aliases() -> None:
    daily = Schedule.build("d", cron="@daily")
    assert daily.cron == "0 0 * * *"
    start = dt.datetime(2024, 5, 1, 12, tzinfo=UTC)
    assert daily.next_after(start) == dt.datetime(2024, 5, 2, tzinfo=UTC)
    assert daily.next_after(dt.datetime(2024, 5, 2, tzinfo=UTC)) == dt.datetime(
        2024, 5, 3, tzinfo=UTC
    )  # strictly after


# -- every ------------------------------------------------------------------------------------


def test_every_slots_are_phase_aligned_and_strictly_after() -> None:
    s = Schedule.build("job-a", every=dt.timedelta(seconds=30))
    assert s.every_us == 30_000_000
    assert 0 <= s.phase_us < 30_000_000 and s.phase_us % 1000 == 0
    t = dt.datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
    first = s.next_after(t)
    assert t < first <= t + dt.timedelta(seconds=30)
    assert s.next_after(first) == first + dt.timedelta(seconds=30)
    assert s.next_after(first - dt.timedelta(microseconds=1)) == first
    since_epoch = (first - dt.datetime(1970, 1, 1, tzinfo=UTC)) // dt.timedelta(microseconds=1)
    assert since_epoch % 30_000_000 == s.phase_us


def test_every_phase_is_stable_and_spreads_jobs() -> None:
    assert phase_of("x", 60_000_000) == phase_of("x", 60_000_000)
    phases = {phase_of(f"job-{i}", 60_000_000) for i in range(200)}
    assert len(phases) > 150  # 200 jobs every minute do not all fire at the same instant


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cron": "61 * * * *"}, "invalid cron expression"),
        ({"cron": "* * * *"}, "has 4 fields"),
        ({"cron": "0 0 * * * *"}, "has 6 fields"),
        ({"cron": "0 2 * * *", "timezone": "Mars/Olympus"}, "unknown time zone"),
        ({"every": dt.timedelta(seconds=0.5)}, "too short"),
        ({"every": dt.timedelta(seconds=5), "timezone": "Europe/Berlin"}, "cron schedules only"),
        ({}, "exactly one of"),
        ({"cron": "0 2 * * *", "every": dt.timedelta(seconds=5)}, "exactly one of"),
    ],
)
def test_bad_schedules_are_refused_with_a_clear_message(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        Schedule.build("bad", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("expr", ["@reboot", "@REBOOT", " @reboot "])
def test_reboot_is_refused_as_not_supported(expr: str) -> None:
    """Issue 31: @reboot was "has 1 fields"; it is cron's, with no slot a scheduler of
    several workers could share."""
    with pytest.raises(InvalidArgument, match="@reboot is not supported") as refused:
        Schedule.build("bad", cron=expr)
    assert "fields" not in str(refused.value)


@pytest.mark.parametrize("ttl", ["100d", "0", 0.001])
def test_out_of_range_ttl_at_definition_names_the_job(ttl: object) -> None:
    """Issue 31: every other definition error starts with `job 'name':`; the ttl's did not."""
    app = Scheduler("postgresql://nowhere.invalid/x")  # never connects: defining only
    with pytest.raises(InvalidArgument, match=r"^job 'nightly': ttl .* out of range"):
        app.add_job("nightly", lambda ctx: None, cron="0 2 * * *", ttl=ttl)  # type: ignore[arg-type]


# -- the claim plan ---------------------------------------------------------------------------

MINUTE = dt.timedelta(minutes=1)
T0 = dt.datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
EVERY_MINUTE = Schedule.build("m", cron="* * * * *")


def missed(schedule: Schedule, p: Plan) -> list[dt.datetime]:
    """Every slot ``p`` records as misfire_skipped, its runs of slots spelled out."""
    out: list[dt.datetime] = []
    for s in p.skipped:
        if s.outcome == "misfire_skipped":
            out.append(s.slot)
            out += itertools.takewhile(
                lambda x, s=s: x <= (s.last or s.slot), schedule.iter_after(s.slot)
            )
            assert len(out) == len(set(out))
    return out


def state(next_slot: dt.datetime, **kw: object) -> JobState:
    return JobState(next_slot, **kw)  # type: ignore[arg-type]


def test_on_time_slot_runs_and_schedule_moves_on() -> None:
    p = plan(EVERY_MINUTE, Policy(), state(T0), T0 + dt.timedelta(seconds=0.02), token=7)
    assert (p.run_slot, p.run_kind, p.next_slot, p.skipped) == (T0, "scheduled", T0 + MINUTE, ())


def test_nothing_due_yet_does_nothing() -> None:
    p = plan(EVERY_MINUTE, Policy(), state(T0), T0 - dt.timedelta(seconds=1), token=7)
    assert p.run_slot is None and p.next_slot is None and not p.skipped


def test_misfire_latest_runs_the_newest_and_records_the_rest() -> None:
    now = T0 + 3 * MINUTE + dt.timedelta(seconds=10)
    p = plan(EVERY_MINUTE, Policy("latest"), state(T0), now, token=2)
    assert p.run_slot == T0 + 3 * MINUTE
    assert missed(EVERY_MINUTE, p) == [T0, T0 + MINUTE, T0 + 2 * MINUTE]
    assert [(s.outcome, s.count) for s in p.skipped] == [("misfire_skipped", 3)]
    assert p.next_slot == T0 + 4 * MINUTE
    assert p.done_slot == T0 + 2 * MINUTE


def test_misfire_latest_beyond_grace_runs_nothing() -> None:
    now = T0 + 3 * MINUTE + dt.timedelta(seconds=10)
    p = plan(EVERY_MINUTE, Policy("latest", misfire_grace=5), state(T0), now, token=2)
    assert p.run_slot is None
    assert len(missed(EVERY_MINUTE, p)) == 4 and p.done_slot == T0 + 3 * MINUTE
    assert p.next_slot == T0 + 4 * MINUTE


def test_misfire_all_runs_the_oldest_and_keeps_the_rest_due() -> None:
    now = T0 + 3 * MINUTE + dt.timedelta(seconds=10)
    p = plan(EVERY_MINUTE, Policy("all"), state(T0), now, token=2)
    assert p.run_slot == T0 and p.next_slot == T0 + MINUTE and not p.skipped


def test_misfire_all_skips_only_slots_beyond_grace() -> None:
    now = T0 + 3 * MINUTE + dt.timedelta(seconds=10)
    p = plan(EVERY_MINUTE, Policy("all", misfire_grace=90), state(T0), now, token=2)
    assert missed(EVERY_MINUTE, p) == [T0, T0 + MINUTE]
    assert p.run_slot == T0 + 2 * MINUTE and p.next_slot == T0 + 3 * MINUTE


def test_misfire_skip_runs_only_an_on_time_slot() -> None:
    late = plan(EVERY_MINUTE, Policy("skip"), state(T0), T0 + dt.timedelta(seconds=30), token=2)
    assert late.run_slot is None and [s.slot for s in late.skipped] == [T0]
    assert late.next_slot == T0 + MINUTE
    on_time = plan(EVERY_MINUTE, Policy("skip"), state(T0), T0 + dt.timedelta(seconds=0.5), token=2)
    assert on_time.run_slot == T0 and not on_time.skipped


def test_a_huge_cron_backlog_is_recorded_in_bounded_batches_one_record_each() -> None:
    first = EVERY_MINUTE.next_after(T0)
    now = first + dt.timedelta(days=2)
    due, following, capped = due_slots(EVERY_MINUTE, first, now, cap=1000)
    assert capped and len(due) == 1000 and following == first + 1000 * MINUTE
    p = plan(EVERY_MINUTE, Policy("latest"), state(first), now, token=3)
    assert p.run_slot is None and len(p.skipped) == 1
    [s] = p.skipped
    assert (s.slot, s.count, s.last, s.outcome) == (first, 1000, due[-1], "misfire_skipped")
    assert p.next_slot == following and p.done_slot == due[-1]  # the next claim continues


def test_a_week_of_missed_every_slots_is_one_record_computed_at_once() -> None:
    every_second = Schedule.build("s", every=dt.timedelta(seconds=1))
    first = every_second.next_after(T0)
    newest = first + dt.timedelta(days=7)
    now = newest + dt.timedelta(seconds=0.4)
    p = plan(every_second, Policy("latest"), state(first), now, token=3)
    [s] = p.skipped
    assert (s.slot, s.count, s.last) == (first, 7 * 86400, newest - dt.timedelta(seconds=1))
    assert s.error.startswith(f"{7 * 86400} slots missed, by ")
    assert (p.run_slot, p.next_slot) == (newest, newest + dt.timedelta(seconds=1))
    # misfire="all" with a grace: the oldest slot within it runs, the older ones are one record.
    p = plan(every_second, Policy("all", 2.0), state(first), now, token=3)
    assert p.run_slot == newest - dt.timedelta(seconds=1)
    assert p.skipped[0].count == 7 * 86400 - 1 and p.next_slot == newest
    # Nothing missed within the grace: nothing recorded.
    p = plan(every_second, Policy("all", 2.0), state(newest), now, token=3)
    assert p.run_slot == newest and not p.skipped
    # skip with a grace shorter than the newest's 0.4s: all of them, the newest too.
    p = plan(every_second, Policy("skip", 0.1), state(first), now, token=3)
    assert p.run_slot is None and p.skipped[0].count == 7 * 86400 + 1
    assert p.done_slot == newest and p.next_slot == newest + dt.timedelta(seconds=1)


def test_unfinished_run_is_retried_with_the_next_attempt() -> None:
    s = state(T0 + MINUTE, running_slot=T0, running_kind="scheduled", running_token=4)
    p = plan(EVERY_MINUTE, Policy(), s, T0 + dt.timedelta(seconds=40), token=5)
    assert (p.run_slot, p.run_kind, p.attempt, p.prior_token) == (T0, "retry", 2, 4)
    assert p.next_slot is None and "retried with token 5" in (p.prior_error or "")


def test_an_ended_run_whose_end_was_late_is_not_retried_and_the_next_slot_runs() -> None:
    s = state(
        T0 + MINUTE, running_slot=T0, running_kind="scheduled", running_token=4,
        prior_ended=True,
    )  # fmt: skip
    p = plan(EVERY_MINUTE, Policy(), s, T0 + MINUTE + dt.timedelta(seconds=1), token=5)
    assert (p.run_slot, p.run_kind, p.done_slot, p.prior_token) == (
        T0 + MINUTE,
        "scheduled",
        T0,
        4,
    )
    assert "not run again" in (p.prior_error or "") and not p.skipped


def test_unfinished_run_is_abandoned_with_on_crash_skip_and_after_max_attempts() -> None:
    s = state(T0 + MINUTE, running_slot=T0, running_kind="scheduled", running_token=4)
    p = plan(EVERY_MINUTE, Policy(on_crash="skip"), s, T0 + dt.timedelta(seconds=40), token=5)
    assert p.run_slot is None
    assert [(x.slot, x.outcome) for x in p.skipped] == [(T0, "abandoned")]
    assert p.done_slot == T0
    worn = state(
        T0 + MINUTE, running_slot=T0, running_kind="retry", running_token=4,
        running_attempt=MAX_ATTEMPTS,
    )  # fmt: skip
    p = plan(EVERY_MINUTE, Policy(), worn, T0 + MINUTE + dt.timedelta(seconds=1), token=5)
    assert p.skipped[0].outcome == "abandoned"
    assert p.run_slot == T0 + MINUTE  # the next due slot runs instead


def test_trigger_runs_when_nothing_scheduled_is_due() -> None:
    at = T0 + dt.timedelta(seconds=20)
    p = plan(EVERY_MINUTE, Policy(), state(T0 + MINUTE, trigger_at=at), at, token=3)
    assert (p.run_slot, p.run_kind, p.trigger_at) == (at, "manual", at)
    # A due scheduled slot goes first; the trigger stays pending for the next claim.
    p = plan(EVERY_MINUTE, Policy(), state(T0, trigger_at=at), at, token=3)
    assert (p.run_slot, p.run_kind, p.trigger_at) == (T0, "scheduled", None)


def test_a_finished_slot_never_runs_again() -> None:
    """Even if next_slot were left behind (it never is), done_slot guards the slot."""
    s = state(T0, done_slot=T0)
    p = plan(EVERY_MINUTE, Policy(), s, T0 + dt.timedelta(seconds=30), token=9)
    assert p.run_slot is None and p.next_slot == T0 + MINUTE


def _gone(streak: int, attempt: int = 1, kind: str = "scheduled") -> JobState:
    return JobState(
        T0 + MINUTE,
        running_slot=T0,
        running_kind=kind,
        running_token=4,
        running_attempt=attempt,
        prior_gone=True,
        crash_streak=streak,
    )


def test_a_run_whose_worker_is_gone_counts_toward_quarantine_and_is_retried() -> None:
    p = plan(EVERY_MINUTE, Policy(), _gone(0), T0 + dt.timedelta(seconds=40), token=5)
    assert (p.run_slot, p.run_kind, p.attempt, p.crash_streak, p.quarantine) == (
        T0,
        "retry",
        2,
        1,
        None,
    )
    assert "ended with its worker gone" in (p.prior_error or "")
    # A run that recorded its end (lost lease, shutdown) does not count.
    lost = JobState(T0 + MINUTE, running_slot=T0, running_kind="scheduled", running_token=4)
    p = plan(EVERY_MINUTE, Policy(), lost, T0 + dt.timedelta(seconds=40), token=5)
    assert (p.run_slot, p.crash_streak) == (T0, 0)
    assert "did not finish" in (p.prior_error or "")


def test_the_nth_run_in_a_row_whose_worker_is_gone_quarantines_the_job() -> None:
    p = plan(EVERY_MINUTE, Policy(), _gone(2, attempt=3), T0 + dt.timedelta(seconds=40), token=9)
    assert p.run_slot is None and p.crash_streak == 3
    assert p.quarantine and p.quarantine.startswith("quarantined: 3 consecutive runs")
    assert [(s.slot, s.outcome) for s in p.skipped] == [(T0, "abandoned")]
    assert p.done_slot == T0 and p.prior_token == 4
    # Configurable per job: quarantine_after=5 keeps retrying (a new slot once the slot's
    # attempts are used up) until the fifth run in a row whose worker is gone.
    five = Policy(quarantine_after=5)
    p = plan(EVERY_MINUTE, five, _gone(2, attempt=3), T0 + MINUTE, token=9)
    assert (p.run_slot, p.run_kind, p.crash_streak, p.quarantine) == (
        T0 + MINUTE,
        "scheduled",
        3,
        None,
    )
    p = plan(EVERY_MINUTE, five, _gone(4), T0 + dt.timedelta(seconds=40), token=9)
    assert p.quarantine is not None and p.crash_streak == 5
    never = Policy(quarantine_after=None)
    p = plan(EVERY_MINUTE, never, _gone(99), T0 + dt.timedelta(seconds=40), token=9)
    assert p.quarantine is None and p.run_slot == T0

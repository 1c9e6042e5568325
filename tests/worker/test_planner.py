"""The worker's planner, decision by decision (no database: soniq_django/worker/planner.py)."""

import pytest

from soniq_django.worker.planner import (
    BURST_WAIT,
    BUSY_WAIT,
    LEASE_WAIT,
    WIND_UP,
    Claim,
    Snapshot,
    Stop,
    StopReason,
    StopRuns,
    Wait,
    backoff,
    plan,
)

NOW = 1000.0


def snap(**facts) -> Snapshot:
    return Snapshot(**{"now": NOW, "poll_interval": 2.0, "grace_seconds": 30.0, **facts})


# (what the loop knows, what it does next)
TABLE = [
    # Claiming: one claim per free slot, with whatever completions are pending.
    ("a free slot", dict(free_slots=1), Claim(1)),
    ("every free slot", dict(free_slots=4, idle=False), Claim(4)),
    ("completions and free slots: one round", dict(pending=3, free_slots=3, idle=False),
     Claim(3)),
    ("completions, no free slot: write them", dict(pending=2, idle=False), Claim(0)),
    ("max_jobs leaves fewer claims than slots", dict(free_slots=4, claims_left=2), Claim(2)),
    ("max_jobs spoken for by reservations", dict(free_slots=4, claims_left=0, idle=False),
     Wait(BUSY_WAIT)),
    ("a negative allowance claims nothing", dict(free_slots=1, claims_left=-1, idle=False),
     Wait(BUSY_WAIT)),
    # Nothing to do: wait for news.
    ("busy, no free slot", dict(idle=False), Wait(BUSY_WAIT)),
    ("the queue was empty: wait a poll interval", dict(free_slots=1, found_nothing=True),
     Wait(2.0)),
    ("the queue was empty, completions pending: write them",
     dict(free_slots=1, found_nothing=True, pending=1, idle=False), Claim(0)),
    # Burst mode.
    ("burst: nothing found and nothing running", dict(burst=True, free_slots=1,
                                                        found_nothing=True),
     Stop(StopReason.NOTHING_LEFT)),
    ("burst: nothing found, a job still running",
     dict(burst=True, found_nothing=True, idle=False), Wait(BURST_WAIT)),
    ("burst: busy", dict(burst=True, idle=False), Wait(BURST_WAIT)),
    ("burst: not yet looked", dict(burst=True, free_slots=1), Claim(1)),
    ("burst: a short poll interval is kept", dict(burst=True, idle=False, found_nothing=True,
                                                  poll_interval=0.05), Wait(0.05)),
    # Burst mode waiting for other workers' leases (--wait-for-leases).
    ("burst, waiting for leases: other workers' leases hold jobs",
     dict(burst=True, free_slots=1, found_nothing=True, wait_for_leases=True, held_elsewhere=2),
     Wait(LEASE_WAIT)),
    ("burst, waiting for leases: none held", dict(burst=True, free_slots=1, found_nothing=True,
                                                  wait_for_leases=True, held_elsewhere=0),
     Stop(StopReason.NOTHING_LEFT)),
    ("burst, waiting for leases: the count failed, so wait",
     dict(burst=True, free_slots=1, found_nothing=True, wait_for_leases=True,
          held_elsewhere=None), Wait(LEASE_WAIT)),
    ("burst, waiting for leases, a short poll interval is kept",
     dict(burst=True, free_slots=1, found_nothing=True, wait_for_leases=True, held_elsewhere=1,
          poll_interval=0.05), Wait(0.05)),
    ("burst, not waiting: others' leases do not keep it",
     dict(burst=True, free_slots=1, found_nothing=True, held_elsewhere=3),
     Stop(StopReason.NOTHING_LEFT)),
    ("burst, waiting for leases, told to stop", dict(burst=True, stopping=True, free_slots=1,
                                                    found_nothing=True, wait_for_leases=True,
                                                    held_elsewhere=1),
     Stop(StopReason.DRAINED)),
    # Stopping: no more claims; settle what runs, within the grace period.
    ("stopping, idle", dict(stopping=True, free_slots=1), Stop(StopReason.DRAINED)),
    ("stopping, completions pending: write them, claim nothing",
     dict(stopping=True, free_slots=2, pending=2, idle=False), Claim(0)),
    ("stopping, a job running: the first drain wait starts the grace period",
     dict(stopping=True, idle=False), Wait(BUSY_WAIT, drain_deadline=NOW + 30.0)),
    ("stopping, within the grace period", dict(stopping=True, idle=False,
                                                drain_deadline=NOW + 1),
     Wait(BUSY_WAIT)),
    ("stopping, the grace period ends within the busy wait: wait no longer than that",
     dict(stopping=True, idle=False, drain_deadline=NOW + 0.25), Wait(0.25)),
    ("stopping, grace period over: ask the running jobs to stop",
     dict(stopping=True, idle=False, drain_deadline=NOW), StopRuns(NOW + WIND_UP)),
    ("asked to stop: completions pending are still written",
     dict(stopping=True, idle=False, pending=1, drain_deadline=NOW - 1,
          stop_deadline=NOW + 1), Claim(0)),
    ("asked to stop: wait for the runs to end", dict(stopping=True, idle=False,
                                                   drain_deadline=NOW - 1,
                                                   stop_deadline=NOW + 1), Wait(BUSY_WAIT)),
    ("asked to stop, and they did", dict(stopping=True, drain_deadline=NOW - 1,
                                         stop_deadline=NOW + 1), Stop(StopReason.DRAINED)),
    ("asked to stop, still running at the deadline: abandon them",
     dict(stopping=True, idle=False, drain_deadline=NOW - 2, stop_deadline=NOW),
     Stop(StopReason.GRACE_OVER)),
    ("max_jobs claimed: drain like a stop", dict(max_jobs_reached=True, free_slots=1,
                                                 claims_left=0, idle=False),
     Wait(BUSY_WAIT, drain_deadline=NOW + 30.0)),
    ("max_jobs claimed and settled", dict(max_jobs_reached=True, free_slots=1, claims_left=0),
     Stop(StopReason.DRAINED)),
    ("burst and stopping: the drain rules", dict(burst=True, stopping=True, idle=False,
                                                 found_nothing=True),
     Wait(BUSY_WAIT, drain_deadline=NOW + 30.0)),
    # Abort and an unknown outcome.
    ("aborted", dict(aborted=True, pending=3, free_slots=1, idle=False),
     Stop(StopReason.ABORTED)),
    ("the last claim's outcome is unknown: back off, not cut short by wake-ups",
     dict(backoff_due=True, unknown_streak=1, free_slots=1), Wait(0.1, wake_early=False)),
    ("backed off: try again", dict(unknown_streak=1, free_slots=1), Claim(1)),
    ("an unknown claim is not an empty queue: a burst worker stays",
     dict(burst=True, backoff_due=True, unknown_streak=3), Wait(0.4, wake_early=False)),
]


@pytest.mark.parametrize("facts, expected", [row[1:] for row in TABLE],
                         ids=[row[0] for row in TABLE])
def test_the_planner_decides(facts, expected):
    assert plan(snap(**facts)) == expected


@pytest.mark.parametrize("streak, seconds", [(1, 0.1), (2, 0.2), (3, 0.4), (5, 1.6), (6, 2.0),
                                             (40, 2.0)])
def test_the_backoff_doubles_up_to_two_seconds(streak, seconds):
    assert backoff(streak) == pytest.approx(seconds)


def test_a_plan_is_always_one_of_claim_wait_stop_runs_or_stop():
    import itertools

    flags = ["aborted", "stopping", "idle", "max_jobs_reached", "found_nothing", "backoff_due",
             "burst", "wait_for_leases"]
    for values in itertools.product([False, True], repeat=len(flags)):
        for pending, free, left, deadline, stop, held in itertools.product(
                (0, 2), (0, 3), (None, 0, 1), (None, NOW - 1, NOW + 1), (None, NOW, NOW + 1),
                (0, 1, None)):
            if deadline is None and stop is not None:
                continue  # runs are asked to stop only once the grace is over
            facts = dict(zip(flags, values), pending=pending, free_slots=free,
                         claims_left=left, drain_deadline=deadline, stop_deadline=stop,
                         unknown_streak=1, held_elsewhere=held)
            decided = plan(snap(**facts))
            assert isinstance(decided, Claim | Wait | StopRuns | Stop)
            winding_down = facts["stopping"] or facts["max_jobs_reached"]
            if isinstance(decided, Wait) and decided.wake_early and winding_down:
                for limit in (deadline, stop):  # a drain never waits past its deadlines
                    assert limit is None or limit <= NOW or NOW + decided.seconds <= limit
            if isinstance(decided, StopRuns):  # once, at the end of the grace, with work
                assert stop is None and deadline is not None and deadline <= NOW
                assert not facts["idle"] and not pending
            if isinstance(decided, Claim):  # never past max_jobs, never more than the slots
                assert 0 <= decided.n <= free and (left is None or decided.n <= left)
                assert decided.n or pending
                assert not (facts["stopping"] or facts["max_jobs_reached"]) or decided.n == 0
            if isinstance(decided, Stop) and decided.reason is not StopReason.ABORTED:
                assert not pending and not facts["backoff_due"]
                assert facts["idle"] or decided.reason is StopReason.GRACE_OVER
            if decided == Stop(StopReason.NOTHING_LEFT) and facts["wait_for_leases"]:
                assert held == 0  # never while another worker's lease may hold a job

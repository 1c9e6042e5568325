"""What the worker's main loop does next: claim n, wait t, ask the runs to stop, or stop.

Pure: no database, no threads.

The loop (worker/loop.py) takes a ``Snapshot`` of what it knows, asks
``plan()``, and acts on the answer; every decision the loop makes lives
here, and tests/worker/test_planner.py tables them.
"""

import enum
from dataclasses import dataclass

#: How long a worker with running jobs waits for news before looking again.
BUSY_WAIT = 0.5
#: A burst worker looks at least this often (it exits as soon as nothing is left).
BURST_WAIT = 0.2
#: A burst worker waiting for other workers' leases (``wait_for_leases``) looks
#: again this often at most: each look is a claim (whose reaper settles lapsed
#: leases) and a count.
LEASE_WAIT = 1.0
#: After the grace period of a stop: how long the runs asked to stop get to end and have
#: their final writes made before the worker abandons them (decision 0032).
WIND_UP = 2.0


class StopReason(enum.Enum):
    """Why the loop ends."""

    ABORTED = "aborted"
    """``abort()``: in-flight jobs are abandoned; their leases will lapse."""
    DRAINED = "drained"
    """Stopping (or ``max_jobs`` claimed), and every claimed job is settled."""
    NOTHING_LEFT = "nothing left"
    """Burst mode: the last claim found nothing and no job is running (with
    ``wait_for_leases``: and no other worker's lease holds a job of its queues)."""
    GRACE_OVER = "grace period over"
    """Stopping, and jobs still run ``WIND_UP`` seconds after they were asked to stop at the
    end of the grace period: the loop abandons them (their leases lapse)."""


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """What the main loop knows at the start of a round."""

    now: float
    """``time.monotonic()``."""
    aborted: bool = False
    stopping: bool = False
    pending: int = 0
    """Final writes handed to the loop (completions, timeouts), not yet written."""
    free_slots: int = 0
    idle: bool = True
    """No job in flight and nothing pending."""
    claims_left: int | None = None
    """Claims ``max_jobs`` still allows, reservations counted; None: no limit."""
    max_jobs_reached: bool = False
    """``max_jobs`` jobs were claimed (answered claims only)."""
    found_nothing: bool = False
    """The last claim found no job, and no wake-up came since."""
    unknown_streak: int = 0
    """Rounds in a row whose claim's outcome stayed unknown (the database failed)."""
    backoff_due: bool = False
    """The last round's claim stayed unknown and the loop has not backed off since."""
    claims_held_until: float | None = None
    """The last claim waited on a lock past its bound (``Answer.held_back``): no claim before
    this ``now``; pending writes go on meanwhile."""
    burst: bool = False
    wait_for_leases: bool = False
    """Burst mode: do not stop while other workers' leases hold jobs of these queues."""
    held_elsewhere: int | None = 0
    """Jobs of these queues under other workers' leases, as last counted (None: unknown)."""
    drain_deadline: float | None = None
    """When the grace period of a stop ends (set by the first drain wait)."""
    stop_deadline: float | None = None
    """When the runs asked to stop at the end of the grace period are abandoned (set by
    ``StopRuns``)."""
    poll_interval: float = 1.0
    grace_seconds: float = 30.0


@dataclass(frozen=True)
class Claim:
    """One round, one database call: write the pending completions and claim ``n`` jobs.

    ``n`` is 0 when there are only writes to make.
    """

    n: int


@dataclass(frozen=True)
class Wait:
    """Sleep ``seconds``; a wake-up (a job finished, a NOTIFY) ends it early if ``wake_early``.

    A backoff after a failing database does not end early. The first wait of
    a drain carries the ``drain_deadline`` the loop keeps from then on.
    """

    seconds: float
    wake_early: bool = True
    drain_deadline: float | None = None


@dataclass(frozen=True)
class StopRuns:
    """The grace period is over: ask every running job to stop; abandon them at ``deadline``.

    A cooperative handler sees the request (``raise_if_cancelled()`` raises); the loop keeps
    writing what is handed over until the runs have ended or ``deadline`` passed.
    """

    deadline: float


@dataclass(frozen=True)
class Stop:
    """Leave the loop."""

    reason: StopReason


Plan = Claim | Wait | StopRuns | Stop


def backoff(unknown_streak: int) -> float:
    """Seconds to wait after ``unknown_streak`` unknown rounds in a row: 0.1 s, doubling to 2."""
    pause: float = 0.05 * 2 ** min(unknown_streak, 6)
    return min(pause, 2.0)


def plan(s: Snapshot) -> Plan:
    """Decide the loop's next step from ``s``."""
    if s.aborted:
        return Stop(StopReason.ABORTED)
    if s.backoff_due:  # the database keeps failing: don't hammer it
        return Wait(backoff(s.unknown_streak), wake_early=False)
    winding_down = s.stopping or s.max_jobs_reached
    held = s.claims_held_until is not None and s.now < s.claims_held_until
    n = 0 if winding_down or s.found_nothing or held else _claimable(s)
    if s.pending or n:
        return Claim(n)
    if winding_down:
        if s.idle:
            return Stop(StopReason.DRAINED)
        if s.drain_deadline is None:
            return Wait(BUSY_WAIT, drain_deadline=s.now + s.grace_seconds)
        if s.stop_deadline is None:
            if s.now >= s.drain_deadline:
                return StopRuns(s.now + WIND_UP)
            return Wait(min(BUSY_WAIT, s.drain_deadline - s.now))
        if s.now >= s.stop_deadline:
            return Stop(StopReason.GRACE_OVER)
        return Wait(min(BUSY_WAIT, s.stop_deadline - s.now))
    if held:  # a lock held the last claim back: claim again after a pause, not at once
        return Wait(s.claims_held_until - s.now)  # type: ignore[operator]
    if s.burst and s.found_nothing and s.idle:
        if s.wait_for_leases and s.held_elsewhere != 0:
            # A dead peer's jobs come back when its leases lapse: wait, then claim.
            return Wait(min(s.poll_interval, LEASE_WAIT))
        return Stop(StopReason.NOTHING_LEFT)
    seconds = s.poll_interval if s.found_nothing else BUSY_WAIT
    return Wait(min(seconds, BURST_WAIT) if s.burst else seconds)


def _claimable(s: Snapshot) -> int:
    if s.claims_left is None:
        return s.free_slots
    return max(0, min(s.free_slots, s.claims_left))

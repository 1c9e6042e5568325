"""The jobs a worker is running, from each claim to its final write."""

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..owned.types import ClaimedJob
from .context import JobContext
from .execution import Outcome

if TYPE_CHECKING:
    from .progress import ProgressWriter


@dataclass
class InFlight:
    """A job this worker is running.

    ``settled`` guards the job's one final write: whoever sets ``done``
    under it (the job thread, or the deadline thread for a timeout) owns that
    write, and holds the lock until the write is over.
    """

    claimed: ClaimedJob
    context: JobContext
    started: float = field(default_factory=time.monotonic)
    settled: threading.Lock = field(default_factory=threading.Lock)
    done: bool = False
    lost: bool = False
    holds_write_lock: bool = False
    """An atomic job's transaction holds SQLite's write lock: no one else can change its row
    until it ends, and the heartbeat could not renew the lease meanwhile (worker/atomic.py)."""
    outcome: Outcome | None = None  # a completion waiting for the batched completer's round
    watched: bool = False
    """Its deadline was given to the deadline thread (it has a time limit): only then has
    that thread anything to forget when the run is settled (deadlines.py)."""
    row_locked: bool = False  # the last renewal found the row locked by another transaction
    commit_pending: bool = False
    """An atomic run's completion is written in its own transaction, whose COMMIT is on its way:
    that transaction holds the row, and the heartbeat leaves it alone (worker/atomic.py)."""
    holding: bool = False
    """Its timeout's write asked to hold its queue slot (soniq_queue_holds) for the handler,
    which runs on: set under ``settled`` before that write, so the hold is released when the
    handler returns even if the write's outcome stayed unknown; cleared by that release.
    The heartbeat renews the hold meanwhile (completer.py, heartbeat.py)."""

    def hold_write_lock(self, held: bool) -> None:
        """An atomic step of this run holds SQLite's write lock (True), or no longer (False)."""
        self.holds_write_lock = held

    @property
    def key(self) -> tuple[str, int]:
        """This run's identity: the job id and the claim's generation.

        One job can be in flight twice in one worker -- a run whose lease
        lapsed while its handler keeps going, and the next claim of the same
        job -- so flights are kept by claim, never by job id alone.
        """
        fence = self.claimed.claim_fence
        return fence.job_id, fence.generation


class Flights:
    """Every job this worker is running, by claim; shared by the loop, job threads and heartbeat.

    A job is tracked from its claim until its final write is over (or known
    not to be this worker's), so an empty registry means nothing is left to
    settle.
    """

    def __init__(self, progress: "ProgressWriter | None" = None, *,
                 using: str | None = None) -> None:
        self.progress = progress
        """Who writes the runs' progress (worker/progress.py), given to each run's context."""
        self.using = using
        """The jobs database alias, given to each run's context (where its steps go)."""
        self._lock = threading.Lock()
        self._emptied = threading.Condition(self._lock)
        self._by_claim: dict[tuple[str, int], InFlight] = {}

    def track(self, claimed: ClaimedJob,
              traces: "Mapping[str, tuple[str, str | None]] | None" = None) -> InFlight:
        return self.track_many([claimed], traces)[0]

    def track_many(self, claimed: list[ClaimedJob],
                   traces: "Mapping[str, tuple[str, str | None]] | None" = None
                   ) -> list[InFlight]:
        """Track every job a round claimed, under one acquisition of the lock.

        ``traces``: the trace contexts the jobs carry, by job id (``Answer.traces``).
        """
        flights = [InFlight(job, JobContext(  # the fence holds the id as text already
            job_id=job.claim_fence.job_id, job_name=job.job_name, queue=job.queue,
            attempts=job.attempts, max_attempts=job.max_attempts,
            generation=job.claim_fence.generation,
            _trace=None if traces is None else traces.get(job.claim_fence.job_id),
            _fence=job.claim_fence, _progress=self.progress, _using=self.using))
            for job in claimed]
        for flight in flights:
            flight.context._write_locked = flight.hold_write_lock
        if flights:
            with self._lock:
                for flight in flights:
                    self._by_claim[flight.key] = flight
        return flights

    def finish(self, flight: InFlight) -> None:
        """Forget this run -- only this one: another claim of the same job may be in flight."""
        self.finish_many([flight])

    def finish_many(self, flights: list[InFlight]) -> None:
        """``finish`` each of ``flights`` (a round's completions), taking the lock once."""
        if not flights:
            return
        with self._lock:
            by_claim = self._by_claim
            removed = False
            for flight in flights:
                key = flight.key
                if by_claim.get(key) is flight:
                    del by_claim[key]
                    removed = True
            if removed and not by_claim:
                self._emptied.notify_all()

    def wait_empty(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the last run to finish; True if none is left."""
        with self._lock:
            return self._emptied.wait_for(lambda: not self._by_claim, timeout)

    def all(self) -> list[InFlight]:
        with self._lock:
            return list(self._by_claim.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_claim)

"""Django signals of a job's life: enqueued, started, finished, refused; a lease lost; a heartbeat.

docs/metrics.md lists each signal's arguments. Every signal's ``sender``
is the job's name (a string) -- ``@receiver(job_finished,
sender="billing.send_invoice")`` hears one handler's jobs -- except
``worker_heartbeat``, whose sender is the worker's id. No signal carries
a job's args, its result or its claim token.

Each is sent with ``send_robust``: a receiver that raises is logged (by
Django, on the ``django.dispatch`` logger) and the job goes on. Receivers
run in the thread that sends -- a worker's job thread, its main loop, its
heartbeat thread, or the enqueuing caller's -- so a slow receiver slows
that thread: keep them quick. Cheap when nobody listens: each helper below
returns at once, before building any argument, while its signal has no
receiver (``Signal.receivers`` is empty); ``tests/test_signals.py``
measures it.
"""

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from django.dispatch import Signal

if TYPE_CHECKING:  # the worker's types; importing them here would import the worker
    from .producer.request import PreparedJob
    from .worker.flight import InFlight

job_enqueued = Signal()
"""A job's row was inserted (inside the caller's transaction; for ``enqueue_on_commit``,
after the commit). ``bulk_enqueue`` sends it once per job, with ``bulk=True``."""
job_started = Signal()
"""A worker is about to run a claimed job's handler."""
job_finished = Signal()
"""A worker's final write of a run applied: ``outcome`` says which one."""
job_refused = Signal()
"""The database's fence refused a run's final write: the claim was no longer this worker's
(its lease lapsed and the job was re-claimed, or it was cancelled): a stale write stopped."""
lease_lost = Signal()
"""A worker's heartbeat found a running job's lease gone; it will write nothing for that run."""
worker_heartbeat = Signal()
"""A worker's heartbeat renewed its own row (every ``HEARTBEAT_SECONDS``)."""
step_recorded = Signal()
"""A durable step ran and its record committed (``current_job().step``; docs/steps.md)."""
step_skipped = Signal()
"""A durable step was found recorded by an earlier run: its result was returned, its
function not called."""

#: The values of ``job_finished``'s ``outcome``.
OUTCOMES = ("done", "retry", "dead", "cancelled", "deferred")


def enqueued(jobs: "Sequence[PreparedJob]", ids: Sequence[uuid.UUID], using: str, *,
             bulk: bool) -> None:
    """Send ``job_enqueued`` for each job just inserted (``ids`` in the same order)."""
    if not job_enqueued.receivers:
        return
    for job, job_id in zip(jobs, ids):
        job_enqueued.send_robust(sender=job.job_name, job_id=job_id, job_name=job.job_name,
                                 queue=job.queue, priority=job.priority,
                                 scheduled_at=job.scheduled_at, using=using, bulk=bulk)


def started(flight: "InFlight", worker_id: str, using: str) -> None:
    """Send ``job_started`` for a run about to begin."""
    if not job_started.receivers:
        return
    claimed = flight.claimed
    job_started.send_robust(sender=claimed.job_name, job_id=claimed.job_id,
                            job_name=claimed.job_name, queue=claimed.queue,
                            attempt=claimed.attempts, max_attempts=claimed.max_attempts,
                            worker_id=worker_id, using=using)


def finished(flight: "InFlight", outcome: str, *, worker_id: str, using: str, duration: float,
             error: str | None = None, exception: BaseException | None = None,
             dead_letter_reason: str | None = None, retry_in: float | None = None) -> None:
    """Send ``job_finished``: ``outcome`` is one of ``OUTCOMES``."""
    if not job_finished.receivers:
        return
    claimed = flight.claimed
    job_finished.send_robust(sender=claimed.job_name, job_id=claimed.job_id,
                             job_name=claimed.job_name, queue=claimed.queue, outcome=outcome,
                             attempt=claimed.attempts, max_attempts=claimed.max_attempts,
                             duration=duration, error=error, exception=exception,
                             dead_letter_reason=dead_letter_reason, retry_in=retry_in,
                             worker_id=worker_id, using=using)


def refused(flight: "InFlight", outcome: str, *, worker_id: str, using: str,
            duration: float) -> None:
    """Send ``job_refused``: the fence refused the final write ``outcome`` would have made."""
    if not job_refused.receivers:
        return
    claimed = flight.claimed
    job_refused.send_robust(sender=claimed.job_name, job_id=claimed.job_id,
                            job_name=claimed.job_name, queue=claimed.queue, outcome=outcome,
                            attempt=claimed.attempts, generation=claimed.claim_fence.generation,
                            duration=duration, worker_id=worker_id, using=using)


def lost(flight: "InFlight", *, worker_id: str, using: str) -> None:
    """Send ``lease_lost`` for a run whose lease the heartbeat found gone."""
    if not lease_lost.receivers:
        return
    claimed = flight.claimed
    lease_lost.send_robust(sender=claimed.job_name, job_id=claimed.job_id,
                           job_name=claimed.job_name, queue=claimed.queue,
                           attempt=claimed.attempts,
                           generation=claimed.claim_fence.generation, worker_id=worker_id,
                           using=using)


def heartbeat(worker_id: str, *, using: str, state: str, in_flight: int) -> None:
    """Send ``worker_heartbeat`` once the worker's row was renewed."""
    if not worker_heartbeat.receivers:
        return
    worker_heartbeat.send_robust(sender=worker_id, worker_id=worker_id, using=using,
                                 state=state, in_flight=in_flight)


def step(recorded: bool, *, job_id: str, job_name: str, name: str, attempt: int,
         atomic: bool, size: int | None, using: str) -> None:
    """Send ``step_recorded`` (``recorded``) or ``step_skipped`` for step ``name`` of a run.

    Plain values only: the job's id and name, the step's name, the run's
    attempt, whether the step is atomic, its result's size in bytes (None
    when skipped), never its result."""
    signal = step_recorded if recorded else step_skipped
    if not signal.receivers:
        return
    signal.send_robust(sender=job_name, job_id=job_id, job_name=job_name, name=name,
                       attempt=attempt, atomic=atomic, size=size, using=using)


__all__ = ["OUTCOMES", "job_enqueued", "job_finished", "job_refused", "job_started",
           "lease_lost", "step_recorded", "step_skipped", "worker_heartbeat"]

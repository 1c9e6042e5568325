"""A job whose name this worker has no handler for: leave it for one that has, or dead-letter it.

During a rolling deploy, workers of two releases serve the same queues: a
job of a handler the new release added reaches old workers, and a job of a
handler it removed reaches new ones. Neither may dead-letter the other's
work on first contact. The rule (``decide``), in order:

1. another live worker that serves the job's queue registered a handler
   for the name in soniq_task_registry → defer: a worker that knows it is
   there to take it;
2. the job was enqueued less than ``UNKNOWN_JOB_GRACE_SECONDS`` ago
   (``created_at``) → defer: a worker that knows it may still be starting;
3. otherwise → dead letter, ``job_not_found`` (replay it once a handler
   exists).

A deferral (``defer_owned``) queues the job again later and takes back
the attempt its claim counted, so old workers never spend a new handler's
attempts, and the start it counted against a rate-limited queue (a
deferral is not a start). The delay doubles with each deferral of the job
(``defer_delay``), from ``DEFER_SECONDS`` to ``DEFER_MAX_SECONDS``: a job no
worker here can run comes back less and less often instead of being claimed
ahead of the jobs the worker can run, every few seconds, for the whole grace
period (docs/decisions/0033). When the facts cannot be read (the database is
unavailable) the job is deferred: any worker can undo a deferral, only a
replay undoes a dead letter.

Both facts are read by the database's clock: the job's age is the
database's time less ``created_at`` (which the database wrote), and a
peer's liveness its heartbeat against the database's time (peers.py), so a
worker whose host clock is off decides as one whose clock is right. (On
SQLite the database's clock is this host's.) They are read in one turn on
the worker's shared connection, never on the job thread's own.
"""

import datetime as dt
import random

from django.db.models import DurationField, ExpressionWrapper, F

from ..conf import get_settings
from ..errors import SoniqError
from ..models import DeadLetterReason, Job
from ..overview import database_time
from ..owned._store import guarded
from ..owned.types import ClaimedJob
from . import peers
from .connection import CallersConnection, SharedConnection
from .execution import Outcome, OutcomeKind

#: Seconds a deferred job waits before any worker may claim it again, at its
#: first deferral (times a jitter from 0.5 to 1, so that the workers deferring
#: it drift apart); doubled at each deferral after it, up to DEFER_MAX_SECONDS.
DEFER_SECONDS = 5.0
#: The longest a deferral makes a job wait (before the jitter): how late, at
#: most, a worker that knows the job sees it come back once it is running.
DEFER_MAX_SECONDS = 30.0


def defer_delay(deferrals: int, jitter: float) -> float:
    """Seconds the deferral of a job deferred ``deferrals`` times before waits.

    ``jitter`` is from 0.5 to 1.
    """
    doubled: float = DEFER_SECONDS * 2 ** min(max(deferrals, 0), 16)
    return min(DEFER_MAX_SECONDS, doubled) * jitter


def deferrals(claimed: ClaimedJob) -> int:
    """How many times the job was deferred before this claim, as its row tells.

    Every claim raises the generation by one and counts an attempt; a
    deferral takes its attempt back. So the generation less the attempts
    counts the claims that were given back (a dead-letter replay, which
    starts the attempts again, counts as some: the delay is capped).
    """
    return max(claimed.claim_fence.generation - claimed.attempts, 0)


def decide(*, age: float | None, knowers: int, grace: float) -> bool:
    """Whether to defer (True) or dead-letter (False) a job no handler here knows.

    ``age``: seconds since the job was enqueued (None: unknown);
    ``knowers``: other live workers that registered its name and serve its queue.
    """
    return knowers > 0 or age is None or age < grace


def resolve(shared: SharedConnection | CallersConnection, worker_id: str, claimed: ClaimedJob,
            error: str | None) -> Outcome:
    """The outcome for ``claimed``, whose name has no handler here: DEFERRED or DEAD.

    Reads the job's age and its peers in one turn on ``shared`` (the
    worker's ``SharedConnection``, or ``run_jobs()``'s caller's
    connection); never raises.
    """
    grace = float(get_settings().UNKNOWN_JOB_GRACE_SECONDS)
    using = shared.using
    try:
        with shared.turn():
            age = _age(using, claimed)
            knowing = peers.knowers(using, claimed.job_name, claimed.queue, exclude=worker_id)
    except SoniqError:
        return _deferred(claimed, f"{error}; deferred (this worker could not read who knows it)")
    if not decide(age=age, knowers=knowing, grace=grace):
        return Outcome(OutcomeKind.DEAD, reason=DeadLetterReason.JOB_NOT_FOUND, error=(
            f"{error}; no live worker registered it, and it was enqueued {age:.0f} s ago: "
            f"longer than UNKNOWN_JOB_GRACE_SECONDS ({grace:g} s)"))
    if knowing:
        return _deferred(claimed, f"{error}; deferred for the {knowing} live worker(s) that "
                         "registered it")
    return _deferred(claimed, f"{error}; deferred for a worker that knows it, until "
                     f"UNKNOWN_JOB_GRACE_SECONDS ({grace:g} s) after it was enqueued")


def _deferred(claimed: ClaimedJob, error: str) -> Outcome:
    return Outcome(OutcomeKind.DEFERRED, error=error,
                   delay=defer_delay(deferrals(claimed), 0.5 + 0.5 * random.random()))


def _age(using: str, claimed: ClaimedJob) -> float | None:
    """Seconds since the job was enqueued, by the database's clock; None when its row is gone."""
    age = ExpressionWrapper(database_time(using) - F("created_at"), output_field=DurationField())
    with guarded(using, atomic=False):
        since: dt.timedelta | None = Job.objects.using(using).filter(
            id=claimed.job_id).annotate(age=age).values_list("age", flat=True).first()
    return None if since is None else since.total_seconds()

"""The owned, fenced queue: ``OwnedJobSource`` and its values.

Every claim is owned and fenced. ``claim_next_owned`` takes a fresh nonce
the caller generated and kept *before* calling; the returned
``ClaimedJob.claim_fence`` must then be presented, unchanged, to every later
operation on that job. An operation returns True only when its exact
mutation applied, False when the job is missing, stale, expired, terminal or
not eligible, and raises -- never returns False -- when the database fails
(QUEUE_PERSISTENCE_FAILED: the outcome is unknown; recover, don't guess).

On PostgreSQL each method is one call to a claim-protocol SQL function; on
SQLite the same rules run in one write transaction.

``lock_wait`` (seconds), on the claims and fenced writes that take it: on
PostgreSQL the call waits at most that long for any one lock another
transaction holds (a row, a queue's settings row, a table), and each of its
statements runs at most twice that. Past it the call raises
QUEUE_PERSISTENCE_FAILED with the reason ``"lock_not_available"``, and --
unlike any other QUEUE_PERSISTENCE_FAILED -- its outcome is known: its
transaction rolled back, nothing was written (a claim's nonces stay unused).
Without it a call waits as long as the lock is held. It is not applied
inside the caller's transaction (its settings are the caller's). On SQLite
the busy timeout bounds every write instead, with the same answer. Every method has an
``a``-prefixed async twin that validates and snapshots its input before
handing the database work to a thread.
"""

import uuid
from collections.abc import Awaitable
from typing import Any, overload

from asgiref.sync import sync_to_async
from django.db import DEFAULT_DB_ALIAS

from .. import progress
from ..conf import get_settings
from ..encoding import encodable, normalize_json, storable
from ..errors import ConfigValidationError
from ..producer.request import JobRequest, coerce_job_id
from ..models import DeadLetterReason
from ._store import PostgresClaims, SqliteClaims, claims_for
from ._submit import OwnedSubmission, snapshot, submit
from .types import (
    INT32_MAX,
    MAX_CLAIM_BATCH,
    MAX_DLQ_RECORD_ID,
    ClaimedJob,
    OwnedJobState,
    QueueClaimFence,
    fence as checked_fence,
    identity,
    positive_int,
    queue_names,
)

__all__ = [
    "ClaimedJob", "JobRequest", "OwnedJobSource", "OwnedJobState", "QueueClaimFence",
]

_FAIL_REASONS = {
    DeadLetterReason.PERMANENT_FAILURE, DeadLetterReason.JOB_NOT_FOUND,
    DeadLetterReason.INVALID_ARGUMENTS,
}


@overload
def _claimed(row: dict[str, Any]) -> ClaimedJob: ...
@overload
def _claimed(row: None) -> None: ...
@overload
def _claimed(row: dict[str, Any] | None) -> ClaimedJob | None: ...


def _claimed(row: dict[str, Any] | None) -> ClaimedJob | None:
    if row is None:
        return None
    return ClaimedJob(
        job_id=row["job_id"],
        job_name=row["job_name"],
        args=row["args"],
        queue=row["queue"],
        priority=row["priority"],
        attempts=row["attempts"],
        max_attempts=row["max_attempts"],
        lease_expires_at=row["lease_expires_at"],
        claim_fence=QueueClaimFence(
            queue=row["queue"],
            job_id=str(row["job_id"]),
            worker_id=row["owner"],
            generation=row["generation"],
            claim_token=row["token"],
        ),
    )


def _lease() -> float:
    return float(get_settings().LEASE_SECONDS)


def _result_ttl() -> float:
    return float(get_settings().RESULT_TTL)


class OwnedJobSource:
    """Owned submission, claim and fenced writes on one database.

    Trusted set-up picks the database alias; no call can select another.
    """

    def __init__(self, using: str = DEFAULT_DB_ALIAS):
        if type(using) is not str or not using:
            raise ConfigValidationError("using must name a database alias")
        self.using = using

    def __repr__(self) -> str:
        return f"<OwnedJobSource using={self.using!r}>"

    @property
    def _claims(self) -> PostgresClaims | SqliteClaims:
        return claims_for(self.using)

    # Submission -------------------------------------------------------

    def submit_owned(self, request: JobRequest, *, submission_id: str, force: bool = False
                     ) -> uuid.UUID:
        """Submit ``request`` under the caller-kept ``submission_id``; return the job id.

        Replaying the same request with the same submission id returns the
        original id, whatever happened to the job since. Raises
        ConfigValidationError for an invalid request and
        SoniqError(QUEUE_SUBMISSION_CONFLICT) for changed content under a
        known id or an active-key collision (``force=True`` with a new
        submission id replaces an owned predecessor).
        """
        return self._submit(snapshot(request, submission_id, force))

    def _submit(self, submission: OwnedSubmission) -> uuid.UUID:
        return submit(self.using, submission)

    def asubmit_owned(self, request: JobRequest, *, submission_id: str,
                      force: bool = False) -> Awaitable[uuid.UUID]:
        """Async twin of ``submit_owned``; await the result.

        The request is validated and copied when this is *called*, before the
        asynchronous bridge: changing the caller's args afterwards, even
        before awaiting, cannot change what is submitted.
        """
        submission = snapshot(request, submission_id, force)
        return sync_to_async(self._submit)(submission)

    # Claims -----------------------------------------------------------

    def claim_next_owned(self, worker_id: str, *, claim_token: str,
                         queues: list[str] | None = None, pid: int | None = None
                         ) -> ClaimedJob | None:
        """Claim the next eligible job with a fresh nonce; None when nothing is eligible.

        ``pid`` (optional) is recorded with the claim, saving a separate
        ``set_pid_owned``. A nonce used before raises
        SoniqError(QUEUE_CLAIM_CONFLICT); after a QUEUE_PERSISTENCE_FAILED,
        call ``recover_owned_claim`` with the same worker id and nonce
        instead of claiming again.
        """
        return self._claim(*_claim_args(worker_id, claim_token, queues, pid))

    def _claim(self, worker_id: str, claim_token: str, queues: list[str] | None,
               pid: int | None) -> ClaimedJob | None:
        row = self._claims.claim(
            worker_id, claim_token, queues, _lease(), _result_ttl(), pid)
        return _claimed(row)

    async def aclaim_next_owned(self, worker_id: str, *, claim_token: str,
                                queues: list[str] | None = None, pid: int | None = None
                                ) -> ClaimedJob | None:
        args = _claim_args(worker_id, claim_token, queues, pid)
        return await sync_to_async(self._claim)(*args)

    def claim_many_owned(self, worker_id: str, *, claim_tokens: list[str],
                         queues: list[str] | None = None, pid: int | None = None,
                         lock_wait: float | None = None) -> list[ClaimedJob]:
        """Claim up to ``len(claim_tokens)`` jobs in one transaction, one fence each.

        The i-th job claimed carries the nonce ``claim_tokens[i]``; the list
        comes back in claim order (priority, then age), shorter -- or empty --
        when fewer jobs are eligible. Nonces left unused were not stored and
        may be sent again. Tokens must be distinct (at most
        ``MAX_CLAIM_BATCH``); a repeated or previously used one raises
        SoniqError(QUEUE_CLAIM_CONFLICT) and claims nothing. After a
        QUEUE_PERSISTENCE_FAILED, recover each nonce with
        ``recover_owned_claim``.
        """
        return self._claim_many(*_claim_many_args(worker_id, claim_tokens, queues, pid),
                                _wait(lock_wait))

    def _claim_many(self, worker_id: str, claim_tokens: list[str], queues: list[str] | None,
                    pid: int | None, lock_wait: float | None = None) -> list[ClaimedJob]:
        rows = self._claims.claim_many(
            worker_id, claim_tokens, queues, _lease(), _result_ttl(), pid, lock_wait)
        return [_claimed(row) for row in rows]

    async def aclaim_many_owned(self, worker_id: str, *, claim_tokens: list[str],
                                queues: list[str] | None = None, pid: int | None = None,
                                lock_wait: float | None = None) -> list[ClaimedJob]:
        args = _claim_many_args(worker_id, claim_tokens, queues, pid)
        return await sync_to_async(self._claim_many)(*args, _wait(lock_wait))

    def recover_owned_claim(self, worker_id: str, *, claim_token: str,
                            lock_wait: float | None = None) -> ClaimedJob | None:
        """The live claim made with this worker id and nonce, or None; claims nothing.

        None means no live claim was seen -- not proof that the original
        claim cannot still commit.
        """
        args = (identity(worker_id, "worker_id"), identity(claim_token, "claim_token"))
        return self._recover(*args, _wait(lock_wait))

    def _recover(self, worker_id: str, claim_token: str, lock_wait: float | None = None
                 ) -> ClaimedJob | None:
        return _claimed(self._claims.recover(worker_id, claim_token, lock_wait))

    async def arecover_owned_claim(self, worker_id: str, *, claim_token: str,
                                   lock_wait: float | None = None) -> ClaimedJob | None:
        args = (identity(worker_id, "worker_id"), identity(claim_token, "claim_token"))
        return await sync_to_async(self._recover)(*args, _wait(lock_wait))

    # Fenced writes ----------------------------------------------------

    def heartbeat_owned(self, fence: QueueClaimFence, *, lock_wait: float | None = None) -> bool:
        """Renew the lease of the exact live claim (also while a cancel is requested).

        ``lock_wait``: on PostgreSQL, wait at most this many seconds for a lock
        another transaction holds on the job's row (or its table); past it
        nothing is written and QUEUE_PERSISTENCE_FAILED is raised with the
        reason ``lock_not_available``. Without it the renewal waits as long
        as the lock is held. Not applied inside the caller's transaction.
        """
        return self._heartbeat(checked_fence(fence), _wait(lock_wait))

    def _heartbeat(self, fence: QueueClaimFence, lock_wait: float | None = None) -> bool:
        return self._claims.heartbeat(fence, _lease(), lock_wait)

    async def aheartbeat_owned(self, fence: QueueClaimFence, *,
                               lock_wait: float | None = None) -> bool:
        return await sync_to_async(self._heartbeat)(checked_fence(fence), _wait(lock_wait))

    def heartbeat_many_owned(self, fences: list[QueueClaimFence], *,
                             lock_wait: float | None = None) -> list[OwnedJobState | None]:
        """Renew several leases and read each claim's state, in one call.

        Returns, for each fence in order, None when its claim is gone (not
        renewed), else its ``OwnedJobState`` (the cancel request a worker
        reads at each renewal). One transaction: on PostgreSQL a row
        another transaction holds makes the whole call wait (up to
        ``lock_wait``); renew the others one by one then.
        """
        return self._heartbeat_many(_fences(fences), _wait(lock_wait))

    def _heartbeat_many(self, fences: list[QueueClaimFence], lock_wait: float | None
                        ) -> list[OwnedJobState | None]:
        if not fences:
            return []
        states = self._claims.heartbeat_many(fences, _lease(), lock_wait)
        return [None if state is None else OwnedJobState(cancel_requested=state[0],
                                                         pid=state[1]) for state in states]

    async def aheartbeat_many_owned(self, fences: list[QueueClaimFence], *,
                                    lock_wait: float | None = None
                                    ) -> list[OwnedJobState | None]:
        return await sync_to_async(self._heartbeat_many)(_fences(fences), _wait(lock_wait))

    def complete_owned(self, fence: QueueClaimFence, result: Any = None, *,
                       lock_wait: float | None = None) -> bool:
        """Complete the exact live claim with a JSON ``result``; False if already done."""
        return self._complete(checked_fence(fence), _result(result), _wait(lock_wait))

    def _complete(self, fence: QueueClaimFence, result: Any, lock_wait: float | None = None
                  ) -> bool:
        return self._claims.complete(fence, result, _result_ttl(), lock_wait)

    def complete_and_claim_owned(self, fence: QueueClaimFence, result: Any = None, *,
                                 claim_tokens: list[str], queues: list[str] | None = None,
                                 pid: int | None = None
                                 ) -> tuple[bool, list[ClaimedJob]]:
        """Complete the exact live claim and claim the next jobs, in one transaction.

        Returns ``(completed, claimed)``: what ``complete_owned`` would have
        answered, and what ``claim_many_owned(fence.worker_id, ...)`` would
        have returned. The two are written together or not at all: on
        QUEUE_PERSISTENCE_FAILED neither outcome is known (retry the
        completion with the same fence; recover each nonce). A worker that
        finishes a job and wants another saves a round trip and a commit.
        """
        completed, claimed = self.complete_many_and_claim_owned(
            [(fence, result)], claim_tokens=claim_tokens, queues=queues, pid=pid)
        return completed[0], claimed

    async def acomplete_and_claim_owned(self, fence: QueueClaimFence, result: Any = None, *,
                                        claim_tokens: list[str],
                                        queues: list[str] | None = None, pid: int | None = None
                                        ) -> tuple[bool, list[ClaimedJob]]:
        completed, claimed = await self.acomplete_many_and_claim_owned(
            [(fence, result)], claim_tokens=claim_tokens, queues=queues, pid=pid)
        return completed[0], claimed

    def complete_many_owned(self, completions: list[tuple[QueueClaimFence, Any]], *,
                            lock_wait: float | None = None) -> list[bool]:
        """Complete several live claims of one worker in one transaction.

        ``completions`` holds ``(fence, result)`` pairs (1 to
        ``MAX_CLAIM_BATCH``), every fence of the same worker id. Returns one
        boolean per pair, in order: each exactly what ``complete_owned``
        would have answered for it alone.
        """
        worker, checked = _completions(completions)
        return self._complete_and_claim(checked, worker, [], None, None, _wait(lock_wait))[0]

    async def acomplete_many_owned(self, completions: list[tuple[QueueClaimFence, Any]], *,
                                   lock_wait: float | None = None) -> list[bool]:
        worker, checked = _completions(completions)
        completed, _ = await sync_to_async(self._complete_and_claim)(
            checked, worker, [], None, None, _wait(lock_wait))
        return completed

    def complete_many_and_claim_owned(self, completions: list[tuple[QueueClaimFence, Any]], *,
                                      claim_tokens: list[str], queues: list[str] | None = None,
                                      pid: int | None = None, lock_wait: float | None = None
                                      ) -> tuple[list[bool], list[ClaimedJob]]:
        """``complete_many_owned`` and ``claim_many_owned`` for the same worker, one transaction.

        Returns ``(completed, claimed)``. Both are written or neither: on
        QUEUE_PERSISTENCE_FAILED recover the nonces (a live claim proves the
        completions committed too) or re-send the completions with the same
        fences.
        """
        args = _complete_and_claim_args(completions, claim_tokens, queues, pid)
        return self._complete_and_claim(*args, _wait(lock_wait))

    async def acomplete_many_and_claim_owned(
        self, completions: list[tuple[QueueClaimFence, Any]], *, claim_tokens: list[str],
        queues: list[str] | None = None, pid: int | None = None,
        lock_wait: float | None = None,
    ) -> tuple[list[bool], list[ClaimedJob]]:
        args = _complete_and_claim_args(completions, claim_tokens, queues, pid)
        return await sync_to_async(self._complete_and_claim)(*args, _wait(lock_wait))

    def _complete_and_claim(self, completions: list[tuple[QueueClaimFence, Any]], worker: str,
                            tokens: list[str], queues: list[str] | None, pid: int | None,
                            lock_wait: float | None = None
                            ) -> tuple[list[bool], list[ClaimedJob]]:
        completed, rows = self._claims.complete_and_claim(
            completions, _result_ttl(), worker, tokens, queues,
            _lease(), pid, lock_wait,
        )
        return completed, [_claimed(row) for row in rows]

    async def acomplete_owned(self, fence: QueueClaimFence, result: Any = None, *,
                              lock_wait: float | None = None) -> bool:
        return await sync_to_async(self._complete)(checked_fence(fence), _result(result),
                                                   _wait(lock_wait))

    def fail_owned(self, fence: QueueClaimFence, error: str, *, retry: bool,
                   dlq_record_id: str | None = None,
                   dead_letter_reason: str = DeadLetterReason.PERMANENT_FAILURE,
                   retry_delay: float | None = None,
                   default_max_attempts: int | None = None,
                   lock_wait: float | None = None) -> bool:
        """Report a failed attempt of the exact live claim.

        ``retry=True`` queues the job again after a backoff while attempts
        remain, and dead-letters it as ``max_retries_exceeded`` when none
        do; ``retry=False`` dead-letters it with ``dead_letter_reason``
        (``permanent_failure``, ``job_not_found`` or ``invalid_arguments``).
        """
        args = _failure(fence, error, retry, dlq_record_id, dead_letter_reason, retry_delay,
                        default_max_attempts)
        return self._fail(*args, _wait(lock_wait))

    def _fail(self, fence: QueueClaimFence, error: str, retry: bool, dlq_record_id: str | None,
              reason: str, delay: float | None, default_max: int,
              lock_wait: float | None = None) -> bool:
        config = get_settings()
        return self._claims.fail(
            fence, error, retry, delay, reason, dlq_record_id, default_max,
            float(config.RETRY_BASE_SECONDS), float(config.RETRY_MAX_SECONDS), lock_wait,
        )

    async def afail_owned(self, fence: QueueClaimFence, error: str, *, retry: bool,
                          dlq_record_id: str | None = None,
                          dead_letter_reason: str = DeadLetterReason.PERMANENT_FAILURE,
                          retry_delay: float | None = None,
                          default_max_attempts: int | None = None,
                          lock_wait: float | None = None) -> bool:
        args = _failure(fence, error, retry, dlq_record_id, dead_letter_reason, retry_delay,
                        default_max_attempts)
        return await sync_to_async(self._fail)(*args, _wait(lock_wait))

    def defer_owned(self, fence: QueueClaimFence, error: str, *, delay: float = 0,
                    lock_wait: float | None = None) -> bool:
        """Give the exact live claim back: queued again in ``delay`` seconds, no attempt spent.

        For a worker that claimed a job it cannot run now -- one whose name
        it has no handler for, say, while another release does. ``error``
        becomes ``last_error``; the claim's attempt is taken back, the
        generation stays raised (this fence owns nothing afterwards). When a
        queued twin holds the job's unique or dedup key the job is finished
        as superseded, as a retry would be. Returns False when the fence no
        longer owns the job or a cancel is requested (acknowledge it
        instead). Raises ConfigValidationError for a non-string error or a
        delay outside 0 s to a year.
        """
        return self._defer(*_deferral(fence, error, delay), _wait(lock_wait))

    def _defer(self, fence: QueueClaimFence, error: str, delay: float,
               lock_wait: float | None = None) -> bool:
        return self._claims.defer(fence, error, delay, _result_ttl(), lock_wait)

    async def adefer_owned(self, fence: QueueClaimFence, error: str, *, delay: float = 0,
                           lock_wait: float | None = None) -> bool:
        return await sync_to_async(self._defer)(*_deferral(fence, error, delay),
                                                _wait(lock_wait))

    # Slots held by handlers that run on (the worker's own; no async twins) ----------

    def _fail_and_hold(self, fence: QueueClaimFence, error: str, *,
                       retry_delay: float | None = None,
                       default_max_attempts: int | None = None,
                       lock_wait: float | None = None) -> bool:
        """``fail_owned(retry=True)`` of a run past its time limit, holding its queue slot.

        In one transaction: while the fence owns the job, a row of
        soniq_queue_holds keeps the claim's queue slot taken for the handler,
        which runs on (a plain function cannot be stopped), with a lease of
        LEASE_SECONDS; then the fenced failure. Returns the failure's answer.
        The worker renews the hold (``_renew_holds``) until the handler
        returns, then deletes it (``_release_hold``).
        """
        args = _failure(fence, error, True, None, DeadLetterReason.PERMANENT_FAILURE,
                        retry_delay, default_max_attempts)
        config = get_settings()
        return self._claims.fail_and_hold(
            args[0], _lease(), args[1], True, args[5], args[4], None, args[6],
            float(config.RETRY_BASE_SECONDS), float(config.RETRY_MAX_SECONDS), _wait(lock_wait))

    def _release_hold(self, fence: QueueClaimFence) -> bool:
        """Delete the hold of this claim (its handler returned); False: there was none."""
        return self._claims.release_hold(checked_fence(fence))

    def _renew_holds(self, worker_id: str, fences: list[QueueClaimFence]) -> int:
        """Renew the live holds of these claims of ``worker_id`` for LEASE_SECONDS; how many.

        At most ``MAX_CLAIM_BATCH`` fences; a lapsed hold is not renewed.
        """
        if not 1 <= len(fences) <= MAX_CLAIM_BATCH:
            raise ConfigValidationError(f"fences must hold 1 to {MAX_CLAIM_BATCH} claims")
        return self._claims.renew_holds(identity(worker_id, "worker_id"),
                                        [checked_fence(f) for f in fences], _lease())

    def set_pid_owned(self, fence: QueueClaimFence, pid: int) -> bool:
        """Record the process id running the exact live claim."""
        return self._set_pid(checked_fence(fence), positive_int(pid, "pid", INT32_MAX))

    def _set_pid(self, fence: QueueClaimFence, pid: int) -> bool:
        return self._claims.set_pid(fence, pid)

    async def aset_pid_owned(self, fence: QueueClaimFence, pid: int) -> bool:
        args = (checked_fence(fence), positive_int(pid, "pid", INT32_MAX))
        return await sync_to_async(self._set_pid)(*args)

    def set_progress_owned(self, fence: QueueClaimFence, done: int, total: int | None = None,
                           note: str | None = None, *, lock_wait: float | None = None) -> bool:
        """Record the progress of the exact live claim (``soniq_set_progress``); False when
        the fence no longer holds. ``ConfigValidationError`` for bad counts or note
        (soniq_django/progress.py)."""
        value = progress.checked(done, total, note)
        return self._set_progress(checked_fence(fence), value, _wait(lock_wait))

    def _set_progress(self, fence: QueueClaimFence, value: "progress.Progress",
                      lock_wait: float | None = None) -> bool:
        return self._claims.set_progress(fence, value.done, value.total, value.note, lock_wait)

    async def aset_progress_owned(self, fence: QueueClaimFence, done: int,
                                  total: int | None = None, note: str | None = None, *,
                                  lock_wait: float | None = None) -> bool:
        args = (checked_fence(fence), progress.checked(done, total, note), _wait(lock_wait))
        return await sync_to_async(self._set_progress)(*args)

    def get_owned_state(self, fence: QueueClaimFence, *, lock_wait: float | None = None
                        ) -> OwnedJobState | None:
        """A snapshot of the live claim's cancel request and pid; None when not owned."""
        return self._get_state(checked_fence(fence), _wait(lock_wait))

    def _get_state(self, fence: QueueClaimFence, lock_wait: float | None = None
                   ) -> OwnedJobState | None:
        state = self._claims.get_state(fence, lock_wait)
        return None if state is None else OwnedJobState(cancel_requested=state[0], pid=state[1])

    async def aget_owned_state(self, fence: QueueClaimFence, *, lock_wait: float | None = None
                               ) -> OwnedJobState | None:
        return await sync_to_async(self._get_state)(checked_fence(fence), _wait(lock_wait))

    def acknowledge_cancel_owned(self, fence: QueueClaimFence, *,
                                 lock_wait: float | None = None) -> bool:
        """Confirm a requested cancel of the exact live claim: the job becomes cancelled."""
        return self._acknowledge(checked_fence(fence), _wait(lock_wait))

    def _acknowledge(self, fence: QueueClaimFence, lock_wait: float | None = None) -> bool:
        return self._claims.acknowledge_cancel(fence, _result_ttl(), lock_wait)

    async def aacknowledge_cancel_owned(self, fence: QueueClaimFence, *,
                                        lock_wait: float | None = None) -> bool:
        return await sync_to_async(self._acknowledge)(checked_fence(fence), _wait(lock_wait))

    # Administration ---------------------------------------------------

    def request_cancel(self, job_id: uuid.UUID | str) -> bool:
        """Cancel a queued job now, or ask a processing job's worker to stop.

        Returns False for a missing or finished job.
        """
        return self._request_cancel(coerce_job_id(job_id))

    def _request_cancel(self, job_id: uuid.UUID) -> bool:
        return self._claims.request_cancel(job_id, _result_ttl())

    async def arequest_cancel(self, job_id: uuid.UUID | str) -> bool:
        return await sync_to_async(self._request_cancel)(coerce_job_id(job_id))


def _wait(lock_wait: Any) -> float | None:
    """A checked ``lock_wait``: None, or a number of seconds above 0 and at most a day."""
    if lock_wait is None:
        return None
    if type(lock_wait) not in (int, float) or not 0 < lock_wait <= 86400:
        raise ConfigValidationError("lock_wait must be a number of seconds above 0, at most a "
                                    "day, or None")
    return float(lock_wait)


def _fences(fences: Any) -> list[QueueClaimFence]:
    """Checked fences for ``heartbeat_many_owned``: a list of 0 to ``MAX_CLAIM_BATCH``."""
    if not isinstance(fences, (list, tuple)) or len(fences) > MAX_CLAIM_BATCH:
        raise ConfigValidationError(f"fences must be a list of at most {MAX_CLAIM_BATCH} fences")
    return [checked_fence(fence) for fence in fences]


def _completions(completions: Any) -> tuple[str, list[tuple[QueueClaimFence, Any]]]:
    """Checked ``(fence, result)`` pairs, and the one worker id they share."""
    if not isinstance(completions, (list, tuple)):
        raise ConfigValidationError("completions must be a list of (fence, result) pairs")
    if not 1 <= len(completions) <= MAX_CLAIM_BATCH:
        raise ConfigValidationError(f"completions must hold 1 to {MAX_CLAIM_BATCH} pairs")
    checked = []
    for pair in completions:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ConfigValidationError("completions must be a list of (fence, result) pairs")
        checked.append((checked_fence(pair[0]), _result(pair[1])))
    workers = {fence.worker_id for fence, _ in checked}
    if len(workers) != 1:
        raise ConfigValidationError("completions must all be fences of one worker")
    return workers.pop(), checked


def _complete_and_claim_args(
    completions: Any, claim_tokens: Any, queues: Any, pid: Any,
) -> tuple[list[tuple[QueueClaimFence, Any]], str, list[str], list[str] | None, int | None]:
    worker, checked = _completions(completions)
    worker, tokens, names, pid = _claim_many_args(worker, claim_tokens, queues, pid)
    return checked, worker, tokens, names, pid


def _claim_many_args(worker_id: Any, claim_tokens: Any, queues: Any, pid: Any
                     ) -> tuple[str, list[str], list[str] | None, int | None]:
    if isinstance(claim_tokens, (str, bytes)) or not isinstance(claim_tokens, (list, tuple)):
        raise ConfigValidationError("claim_tokens must be a list of nonces")
    if not 1 <= len(claim_tokens) <= MAX_CLAIM_BATCH:
        raise ConfigValidationError(f"claim_tokens must hold 1 to {MAX_CLAIM_BATCH} nonces")
    tokens = [identity(token, "claim_token") for token in claim_tokens]
    worker, _, names, pid = _claim_args(worker_id, tokens[0], queues, pid)
    return worker, tokens, names, pid


def _claim_args(worker_id: Any, claim_token: Any, queues: Any, pid: Any
                ) -> tuple[str, str, list[str] | None, int | None]:
    return (identity(worker_id, "worker_id"), identity(claim_token, "claim_token"),
            queue_names(queues), None if pid is None else positive_int(pid, "pid", INT32_MAX))


def _result(result: Any) -> Any:
    if result is None:  # most results, already JSON
        return None
    try:
        return normalize_json(result)
    except Exception:
        raise ConfigValidationError("result must be finite standard JSON") from None


def _failure(fence: Any, error: Any, retry: Any, dlq_record_id: Any, reason: Any, delay: Any,
             default_max: Any
             ) -> tuple[QueueClaimFence, str, bool, str | None, str, float | None, int]:
    fence = checked_fence(fence)
    if type(error) is not str:
        raise ConfigValidationError("error must be a string")
    if type(retry) is not bool:
        raise ConfigValidationError("retry must be True or False")
    if dlq_record_id is not None and (
        type(dlq_record_id) is not str or not dlq_record_id
        or len(dlq_record_id) > MAX_DLQ_RECORD_ID or not encodable(dlq_record_id)
    ):
        raise ConfigValidationError(
            f"dlq_record_id must be a non-empty string of at most {MAX_DLQ_RECORD_ID} characters"
        )
    if reason not in _FAIL_REASONS:
        raise ConfigValidationError("dead_letter_reason must be a dead-letter reason")
    if delay is not None and (type(delay) not in (int, float) or not 0 <= delay <= 31536000):
        raise ConfigValidationError("retry_delay must be a number of seconds from 0 to a year")
    if default_max is None:
        default_max = get_settings().DEFAULT_MAX_ATTEMPTS
    positive_int(default_max, "default_max_attempts", INT32_MAX)
    # Text cannot hold NUL nor a lone surrogate; a traceback, a handler's message may.
    return fence, storable(error), retry, dlq_record_id, str(reason), delay, default_max


def _deferral(fence: Any, error: Any, delay: Any) -> tuple[QueueClaimFence, str, float]:
    fence = checked_fence(fence)
    if type(error) is not str:
        raise ConfigValidationError("error must be a string")
    if type(delay) not in (int, float) or not 0 <= delay <= 31536000:
        raise ConfigValidationError("delay must be a number of seconds from 0 to a year")
    return fence, storable(error), float(delay)

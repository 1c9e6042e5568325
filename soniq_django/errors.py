"""The one exception hierarchy of soniq_django.

Every error carries a stable ``code`` (an :class:`ErrorCode`) and a short
authored ``reason``. Messages never echo job ids, claim tokens, job
arguments, connection strings or driver text: callers branch on ``code``,
and people read ``reason``.
"""

import enum


class ErrorCode(enum.StrEnum):
    """Stable error codes. The ``SONIQ_…`` ones are shared with the SQL API's HINT."""

    INVALID_TASK_NAME = "SONIQ_INVALID_TASK_NAME"
    """The job name does not match the task-name pattern."""
    TASK_ARGS_INVALID = "SONIQ_TASK_ARGS_INVALID"
    """Args are not a JSON object of finite standard JSON, or do not fit the handler."""
    INVALID_MAX_ATTEMPTS = "SONIQ_INVALID_MAX_ATTEMPTS"
    """``max_attempts`` is below 1 or not an integer."""
    DUPLICATE_JOB_ID = "SONIQ_DUPLICATE_JOB_ID"
    """A job with the requested id already exists (SQLSTATE 23505 in SQL)."""
    INVALID_OPTION = "SONIQ_INVALID_OPTION"
    """An enqueue option (queue, priority, run_at, job_id, …) has the wrong type or range."""
    CONFIG = "CONFIG"
    """An invalid option, request, result or fence."""
    QUEUE_SUBMISSION_CONFLICT = "QUEUE_SUBMISSION_CONFLICT"
    """An owned submission mismatch, collision or inconsistent protection."""
    QUEUE_CLAIM_CONFLICT = "QUEUE_CLAIM_CONFLICT"
    """A claim nonce collision, an exhausted generation or a changed claim identity."""
    QUEUE_PERSISTENCE_FAILED = "QUEUE_PERSISTENCE_FAILED"
    """The database was unavailable (connection lost, server shutting down, out of
    connections, a lock or serialization conflict), or a commit was not acknowledged;
    the outcome is unknown and the same call may succeed later."""
    QUEUE_DATABASE_REFUSED = "QUEUE_DATABASE_REFUSED"
    """The database refused an owned operation for a reason other than its availability
    (a constraint, a trigger, a missing function): nothing was written, and sending the
    same call again gives the same answer. The reason names the SQLSTATE."""


_MAX_REASON = 200


class SoniqError(Exception):
    """Root of every soniq_django error.

    ``code`` is an :class:`ErrorCode`; ``reason`` is a bounded, authored
    sentence that is safe to log.
    """

    def __init__(self, code: ErrorCode, reason: str = ""):
        self.code = ErrorCode(code)
        self.reason = (reason or self.code.value)[:_MAX_REASON]
        super().__init__(f"{self.code.value}: {self.reason}")


class ConfigValidationError(SoniqError):
    """Invalid caller input: an option, a request, a result or a fence."""

    def __init__(self, reason: str = "", code: ErrorCode = ErrorCode.CONFIG):
        super().__init__(code, reason)


class PermanentFailure(Exception):
    """Raise from a job handler when retrying cannot help.

    The worker moves the job straight to the dead letters with the reason
    ``permanent_failure`` instead of retrying it.
    """


class JobCancelled(Exception):
    """Raised inside a handler (by ``JobContext.raise_if_cancelled``) once a cancel is requested."""

"""Every exception of soniq_django: one tree under ``SoniqError``.

Every error carries a stable ``code`` (an :class:`ErrorCode`) and a short
authored ``reason``. Messages never echo job ids, claim tokens, job
arguments, connection strings or driver text: callers branch on ``code``,
and people read ``reason``.

::

    SoniqError
    ├── ConfigValidationError   bad input: INVALID_TASK_NAME, TASK_ARGS_INVALID,
    │                           INVALID_MAX_ATTEMPTS, INVALID_OPTION, CONFIG
    ├── SchemaAdmissionError    SCHEMA_REFUSED (also an ImproperlyConfigured)
    ├── TablesShapeError        SCHEMA_REFUSED
    ├── DowngradeRefused        QUEUE_SUBMISSION_CONFLICT
    ├── PermanentFailure        PERMANENT_FAILURE (raised by a job handler)
    └── JobCancelled            JOB_CANCELLED (raised inside a job handler)

Plain ``SoniqError`` carries the other codes: DUPLICATE_JOB_ID,
QUEUE_SUBMISSION_CONFLICT, QUEUE_CLAIM_CONFLICT, QUEUE_PERSISTENCE_FAILED,
QUEUE_DATABASE_REFUSED.
"""

import enum

from django.core.exceptions import ImproperlyConfigured


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
    """The database refused the operation for a reason other than its availability
    (a constraint, a trigger, a missing function): nothing was written, and sending the
    same call again gives the same answer. The reason names the SQLSTATE."""
    SCHEMA_REFUSED = "SCHEMA_REFUSED"
    """A migration found tables or columns it cannot take over; it changed nothing."""
    PERMANENT_FAILURE = "PERMANENT_FAILURE"
    """A job handler says retrying cannot help: the job is dead-lettered at once."""
    JOB_CANCELLED = "JOB_CANCELLED"
    """A cancel of the running job was requested; its handler stops."""


#: The codes of bad input, each raised as a ``ConfigValidationError``.
INPUT_CODES = frozenset({
    ErrorCode.INVALID_TASK_NAME, ErrorCode.TASK_ARGS_INVALID, ErrorCode.INVALID_MAX_ATTEMPTS,
    ErrorCode.INVALID_OPTION, ErrorCode.CONFIG,
})

_MAX_REASON = 200


def _bounded(reason: str) -> str:
    return reason[:_MAX_REASON]


class SoniqError(Exception):
    """Root of every soniq_django error.

    ``code`` is an :class:`ErrorCode`; ``reason`` is a bounded, authored
    sentence that is safe to log.
    """

    def __init__(self, code: ErrorCode, reason: str = ""):
        self.code = ErrorCode(code)
        self.reason = _bounded(reason or self.code.value)
        super().__init__(f"{self.code.value}: {self.reason}")


class ConfigValidationError(SoniqError):
    """Invalid caller input: an option, a request, a result or a fence.

    ``code`` is one of ``INPUT_CODES`` (CONFIG unless a more precise one applies).
    """

    def __init__(self, reason: str = "", code: ErrorCode = ErrorCode.CONFIG):
        if code not in INPUT_CODES:
            raise ValueError(f"{code} is not a code of bad input")
        super().__init__(code, reason)


class SchemaAdmissionError(SoniqError, ImproperlyConfigured):
    """The owned schema is refused; ``problems`` lists every reason.

    Also an ``ImproperlyConfigured``, which is what ``migrate`` callers catch.
    The message lists every problem, one line each; ``reason`` counts them.
    """

    def __init__(self, problems):
        self.problems = tuple(problems)
        self.code = ErrorCode.SCHEMA_REFUSED
        rules = sorted({problem.rule for problem in self.problems})
        self.reason = _bounded(f"owned-queue schema refused: {len(self.problems)} problem(s) "
                               f"(rules {', '.join(rules)})")
        lines = [f"- {problem.message}" for problem in self.problems]
        Exception.__init__(self, "owned-queue schema refused:\n" + "\n".join(lines))


class TablesShapeError(SoniqError):
    """soniq_workers or soniq_task_registry is in neither shape migration 0006 knows."""

    def __init__(self, reason: str):
        super().__init__(ErrorCode.SCHEMA_REFUSED, reason)


class DowngradeRefused(SoniqError):
    """Protected submissions or live owned claims remain; nothing was changed.

    ``code`` is ``QUEUE_SUBMISSION_CONFLICT``; ``retained`` holds the counts
    (a ``schema.owned_metadata.Retained``). The reason names counts and
    tables only, never ids, tokens or payloads.
    """

    def __init__(self, retained):
        self.retained = retained
        super().__init__(
            ErrorCode.QUEUE_SUBMISSION_CONFLICT,
            f"downgrade refused: protected submissions in soniq_jobs {retained.protected_jobs}, "
            f"in soniq_dead_letter_jobs {retained.protected_dead_letters}; active owned claims "
            f"{retained.active_claims}. Retire or finish them first.",
        )


class PermanentFailure(SoniqError):
    """Raise from a job handler when retrying cannot help: ``PermanentFailure("card declined")``.

    The worker moves the job straight to the dead letters with the reason
    ``permanent_failure`` instead of retrying it. The message is the
    handler's own and is kept whole (it goes into ``last_error``); ``reason``
    is its first 200 characters.
    """

    def __init__(self, *args):
        self.code = ErrorCode.PERMANENT_FAILURE
        self.reason = _bounded(str(args[0]) if args else "") or self.code.value
        Exception.__init__(self, *args)


class JobCancelled(SoniqError):
    """Raised inside a handler (by ``JobContext.raise_if_cancelled``) once a cancel is requested."""

    def __init__(self, *args):
        self.code = ErrorCode.JOB_CANCELLED
        self.reason = _bounded(str(args[0]) if args else "") or "the job's cancel was requested"
        Exception.__init__(self, *args)

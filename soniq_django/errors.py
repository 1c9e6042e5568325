"""Every exception of soniq_django: one tree under ``SoniqError``.

Every error carries a stable ``code`` (an :class:`ErrorCode`) and a short
authored ``reason``. Messages never echo job ids, claim tokens, job
arguments, connection strings or driver text: callers branch on ``code``,
and people read ``reason``.

::

    SoniqError
    ├── ConfigValidationError   bad input: INVALID_TASK_NAME, TASK_ARGS_INVALID,
    │   │                       INVALID_MAX_ATTEMPTS, INVALID_OPTION, CONFIG
    │   │                       (and a step's: STEP_NOT_JSON, STEP_TOO_LARGE, STEP_DUPLICATE)
    │   └── PayloadTooLarge     PAYLOAD_TOO_LARGE (args over SONIQ["MAX_PAYLOAD_BYTES"])
    ├── SettingsInvalid         SETTINGS_INVALID (also an ImproperlyConfigured)
    ├── MigrationsNotApplied    QUEUE_DATABASE_REFUSED (a soniq table or function missing)
    ├── SchemaAdmissionError    SCHEMA_REFUSED (also an ImproperlyConfigured)
    ├── TablesShapeError        SCHEMA_REFUSED
    ├── DowngradeRefused        QUEUE_SUBMISSION_CONFLICT
    ├── StepNotRecorded     STEP_NOT_RECORDED (a step's claim no longer held)
    ├── WaitTimeout             WAIT_TIMEOUT (wait_for_job: the job is not finished yet)
    ├── PermanentFailure        PERMANENT_FAILURE (raised by a job handler)
    └── JobCancelled            JOB_CANCELLED (raised inside a job handler)

Plain ``SoniqError`` carries the other codes: DUPLICATE_JOB_ID,
QUEUE_SUBMISSION_CONFLICT, QUEUE_CLAIM_CONFLICT, QUEUE_PERSISTENCE_FAILED,
QUEUE_DATABASE_REFUSED, ASYNC_CONTEXT, JOB_FAILED.
"""

import enum
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured
from django.db import Error as DatabaseError
from django.db import IntegrityError, InterfaceError, OperationalError
from django.db.transaction import TransactionManagementError

if TYPE_CHECKING:
    from .schema.admission import Problem
    from .schema.owned_metadata import Retained


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
    ASYNC_CONTEXT = "ASYNC_CONTEXT"
    """A synchronous call (``enqueue``, ``get_job``, ...) was made while an event loop runs
    in this thread; the reason names its ``a``-prefixed twin to await instead."""
    JOB_FAILED = "JOB_FAILED"
    """``soniq_django.testing`` ran a job that was dead-lettered without an exception of
    its handler's own to re-raise (no handler, arguments that do not fit, a non-JSON result)."""
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    """The job args, as compact UTF-8 JSON, are larger than ``SONIQ["MAX_PAYLOAD_BYTES"]``;
    the reason gives both sizes (and, in ``bulk_enqueue``, the request's index)."""
    SETTINGS_INVALID = "SETTINGS_INVALID"
    """A ``SONIQ`` setting the call needs has a value the system checks reject; the reason
    names the key, the value's type and the check id (``manage.py check`` says the same)."""
    WAIT_TIMEOUT = "WAIT_TIMEOUT"
    """``wait_for_job``/``await_job``: the job had not finished when the timeout ran out;
    the error's ``job`` is the job as last read (None: not found), the reason its status."""
    EXTRA_NOT_INSTALLED = "EXTRA_NOT_INSTALLED"
    """A module of soniq_django needs an optional package that is not installed; the reason
    names the package and the ``pip install soniq-django[extra]`` that brings it."""
    UNKNOWN_DEPENDENCY = "SONIQ_UNKNOWN_DEPENDENCY"
    """A job named in ``depends_on`` is in neither job table (never enqueued, or purged):
    nothing was written. A dependency can only name a job that exists, so no cycle can be
    built (the SQL API's HINT of SQLSTATE 22023 is the same code)."""
    STEP_NOT_JSON = "SONIQ_STEP_NOT_JSON"
    """A durable step's function returned a value that is not JSON (``current_job().step``):
    nothing was recorded (an atomic step's writes were rolled back)."""
    STEP_TOO_LARGE = "SONIQ_STEP_TOO_LARGE"
    """A durable step's result, as JSON text, is larger than ``SONIQ["STEP_MAX_BYTES"]`` (the
    SQL API's HINT of SQLSTATE 54000): nothing was recorded; the reason gives both sizes."""
    STEP_DUPLICATE = "SONIQ_STEP_DUPLICATE"
    """A durable step's name was used twice in one run of a job (or, in the SQL API, recorded
    already: SQLSTATE 23505's HINT). Names are unique within a job."""
    STEP_NOT_RECORDED = "STEP_NOT_RECORDED"
    """A durable step could not be recorded because its run's claim no longer holds (its
    lease lapsed, it was re-claimed), or the COMMIT of an atomic step was lost and the
    database shows it did not happen. The run stops; the job's next attempt runs the step."""


#: The codes of bad input, each raised as a ``ConfigValidationError``.
INPUT_CODES = frozenset({
    ErrorCode.INVALID_TASK_NAME, ErrorCode.TASK_ARGS_INVALID, ErrorCode.INVALID_MAX_ATTEMPTS,
    ErrorCode.INVALID_OPTION, ErrorCode.CONFIG, ErrorCode.PAYLOAD_TOO_LARGE,
    ErrorCode.UNKNOWN_DEPENDENCY, ErrorCode.STEP_NOT_JSON, ErrorCode.STEP_TOO_LARGE,
    ErrorCode.STEP_DUPLICATE,
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


class RunRolledBack(SoniqError):
    """Unwinds an atomic job's transaction (worker/atomic.py); ``outcome`` is how the run ended.

    Raised and caught inside the worker only; never reaches a caller.
    """

    def __init__(self, outcome: Any):
        super().__init__(ErrorCode.JOB_FAILED, "the atomic run's transaction was rolled back")
        self.outcome = outcome


class StepNotRecorded(SoniqError):
    """A durable step was not recorded: its run's claim no longer holds (code STEP_NOT_RECORDED).

    Raised by ``current_job().step`` into the handler, which should let it
    propagate: the run's final write would be refused too. The job's next
    attempt (another claim) runs the step, or returns its recorded result.
    """

    def __init__(self, reason: str):
        super().__init__(ErrorCode.STEP_NOT_RECORDED, reason)


class WaitTimeout(SoniqError):
    """``wait_for_job``'s timeout ran out before the job finished (code WAIT_TIMEOUT).

    ``job`` is the job as last read -- its status and progress -- or None when
    no job has this id (unknown, not committed yet, or purged).
    """

    def __init__(self, reason: str, job: Any = None):
        super().__init__(ErrorCode.WAIT_TIMEOUT, reason)
        self.job = job


class ConfigValidationError(SoniqError):
    """Invalid caller input: an option, a request, a result or a fence.

    ``code`` is one of ``INPUT_CODES`` (CONFIG unless a more precise one applies).
    """

    def __init__(self, reason: str = "", code: ErrorCode = ErrorCode.CONFIG):
        if code not in INPUT_CODES:
            raise ValueError(f"{code} is not a code of bad input")
        super().__init__(code, reason)


class PayloadTooLarge(ConfigValidationError):
    """The job args are larger than ``SONIQ["MAX_PAYLOAD_BYTES"]`` (code PAYLOAD_TOO_LARGE).

    ``size`` and ``limit`` are in bytes of compact UTF-8 JSON; ``index`` is the
    request's position in a ``bulk_enqueue`` (None for one job). The reason
    gives the sizes, never the args.
    """

    def __init__(self, size: int, limit: int, index: int | None = None):
        self.size, self.limit, self.index = size, limit, index
        where = "" if index is None else f"request {index} (counting from 0): "
        super().__init__(
            f"{where}the job args are {size:,} bytes as JSON, more than "
            f"SONIQ['MAX_PAYLOAD_BYTES'] ({limit:,}); pass ids and let the handler load the data",
            code=ErrorCode.PAYLOAD_TOO_LARGE)

    def at(self, index: int) -> "PayloadTooLarge":
        """The same error, naming the position of the request in a bulk enqueue."""
        return PayloadTooLarge(self.size, self.limit, index)


class SettingsInvalid(SoniqError, ImproperlyConfigured):
    """A ``SONIQ`` setting has a value the system checks reject, and a call needs it.

    ``key`` is the setting, ``check_id`` the check that reports it
    (``soniq.E003``, ``soniq.E004``); the reason says what the value must be
    and its type, never the value. Also an ``ImproperlyConfigured``.
    """

    def __init__(self, key: str, check_id: str, reason: str):
        self.key, self.check_id = key, check_id
        super().__init__(ErrorCode.SETTINGS_INVALID, reason)


class ExtraNotInstalled(SoniqError, ImportError):
    """Importing a module that needs an optional package, without it (code EXTRA_NOT_INSTALLED).

    Also an ``ImportError``, so ``except ImportError`` keeps working. ``package``
    is the missing import name, ``extra`` the soniq-django extra that installs it.
    """

    def __init__(self, package: str, extra: str, what: str):
        self.package, self.extra = package, extra
        super().__init__(ErrorCode.EXTRA_NOT_INSTALLED,
                         f"{what} needs {package}, which is not installed: "
                         f"pip install soniq-django[{extra}]")
        self.name = package


class MigrationsNotApplied(SoniqError):
    """A soniq table or SQL function is missing on the database: its migrations are not applied.

    Code QUEUE_DATABASE_REFUSED (the database refused; the same call gets the
    same answer until ``migrate`` runs). ``alias`` is the database alias when
    the caller knew it, ``what`` the SQLSTATE (SQLite: its result code); the
    reason names both and the command to run.
    """

    def __init__(self, alias: str | None, what: str):
        self.alias, self.what = alias, what
        where = f"database {alias!r}" if alias else "this database"
        command = "python manage.py migrate soniq_django" + (f" --database {alias}" if alias else "")
        super().__init__(ErrorCode.QUEUE_DATABASE_REFUSED,
                         f"soniq_django migrations are not applied on {where} ({what}: a soniq "
                         f"table or function is missing). Run: {command}")


class SchemaAdmissionError(SoniqError, ImproperlyConfigured):
    """The owned schema is refused; ``problems`` lists every reason.

    Also an ``ImproperlyConfigured``, which is what ``migrate`` callers catch.
    The message lists every problem, one line each; ``reason`` counts them.
    """

    def __init__(self, problems: "Iterable[Problem]"):
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
    """Protected submissions, live owned claims or held-back keyed jobs remain; nothing was changed.

    ``code`` is ``QUEUE_SUBMISSION_CONFLICT``; ``retained`` holds the counts
    (a ``schema.owned_metadata.Retained``). The reason names counts and
    tables only, never ids, tokens or payloads.
    """

    def __init__(self, retained: "Retained"):
        self.retained = retained
        super().__init__(
            ErrorCode.QUEUE_SUBMISSION_CONFLICT,
            f"downgrade refused: protected submissions in soniq_jobs {retained.protected_jobs}, "
            f"in soniq_dead_letter_jobs {retained.protected_dead_letters}; active owned claims "
            f"{retained.active_claims}; keyed jobs held back by their keys' limits "
            f"{retained.held_back_keyed_jobs}. Retire or finish them first.",
        )


class PermanentFailure(SoniqError):
    """Raise from a job handler when retrying cannot help: ``PermanentFailure("card declined")``.

    The worker moves the job straight to the dead letters with the reason
    ``permanent_failure`` instead of retrying it. The message is the
    handler's own and is kept whole (it goes into ``last_error``); ``reason``
    is its first 200 characters.
    """

    def __init__(self, *args: object):
        self.code = ErrorCode.PERMANENT_FAILURE
        self.reason = _bounded(str(args[0]) if args else "") or self.code.value
        Exception.__init__(self, *args)


class JobCancelled(SoniqError):
    """Raised inside a handler (by ``JobContext.raise_if_cancelled``) once a cancel is requested."""

    def __init__(self, *args: object):
        self.code = ErrorCode.JOB_CANCELLED
        self.reason = _bounded(str(args[0]) if args else "") or "the job's cancel was requested"
        Exception.__init__(self, *args)


# --------------------------------------------------------------------------
# The one translation of database errors


#: Reasons for the SQL API's validation HINTs (22023), one per code.
_HINTED = {
    ErrorCode.INVALID_TASK_NAME: "the job name does not match the database's task-name pattern",
    ErrorCode.TASK_ARGS_INVALID: "the database refused the job args",
    ErrorCode.INVALID_MAX_ATTEMPTS: "max_attempts must be at least 1",
    ErrorCode.INVALID_OPTION: "the database refused an enqueue option",
    ErrorCode.CONFIG: "the database refused an owned request",
    ErrorCode.UNKNOWN_DEPENDENCY: "a job named in depends_on does not exist",
    ErrorCode.STEP_TOO_LARGE: "the step result is larger than the database's max_bytes",
    ErrorCode.STEP_DUPLICATE: "this step is already recorded for the job",
}
_CLAIM_REASONS = frozenset({"nonce_reused", "generation_exhausted", "claim_identity_changed"})
_JOB_IDS = frozenset({"soniq_jobs_pkey", "soniq_dead_letter_jobs_pkey"})
_CLAIM_TOKEN = "soniq_jobs_claim_token_key"
_JOB_TABLES = frozenset({"soniq_jobs", "soniq_dead_letter_jobs"})

# SQLite has no SQLSTATE: its extended result codes, as the standard's classes.
_SQLITE_STATES = {
    "SQLITE_CONSTRAINT_PRIMARYKEY": "23505", "SQLITE_CONSTRAINT_UNIQUE": "23505",
    "SQLITE_CONSTRAINT_NOTNULL": "23502", "SQLITE_CONSTRAINT_FOREIGNKEY": "23503",
    "SQLITE_CONSTRAINT_CHECK": "23514",
}
_SQLITE_UNIQUE = re.compile(r"UNIQUE constraint failed: (\w+)\.(\w+)")


def _driver_error(error: BaseException) -> BaseException:
    """The driver's own exception: Django's wrapper keeps it as ``__cause__``."""
    return error.__cause__ if isinstance(error, DatabaseError) and error.__cause__ else error


def sqlstate(error: BaseException) -> str | None:
    """The SQLSTATE of a database error; SQLite's constraint failures as their class (23…)."""
    driver = _driver_error(error)
    state: str | None = getattr(driver, "sqlstate", None)
    if state is not None:
        return state
    name = getattr(driver, "sqlite_errorname", None) or ""
    if name.startswith("SQLITE_CONSTRAINT") or isinstance(error, IntegrityError):
        return _SQLITE_STATES.get(name, "23000")
    return None


def _constraint(driver: BaseException) -> str | None:
    """The violated constraint's name (PostgreSQL), or its equivalent on soniq's SQLite tables."""
    name = getattr(getattr(driver, "diag", None), "constraint_name", None)
    if name is not None or getattr(driver, "sqlite_errorname", None) is None:
        return name
    match = _SQLITE_UNIQUE.fullmatch(str(driver))
    if match is None or match[1] not in _JOB_TABLES:
        return None
    if getattr(driver, "sqlite_errorname") == "SQLITE_CONSTRAINT_PRIMARYKEY":
        return f"{match[1]}_pkey"
    return _CLAIM_TOKEN if match.groups() == ("soniq_jobs", "claim_token") else None


#: SQLSTATE classes of an unavailable database: connection exception,
#: transaction rollback (serialization, deadlock), insufficient resources,
#: object not in prerequisite state (lock not available), operator
#: intervention (shutdown, cancel, statement timeout), system error.
_UNAVAILABLE_CLASSES = frozenset({"08", "40", "53", "55", "57", "58"})
#: SQLite's primary result codes of the same kind: BUSY and LOCKED ("database
#: is locked"), NOMEM, INTERRUPT, IOERR, FULL, CANTOPEN, PROTOCOL.
_SQLITE_UNAVAILABLE = frozenset({5, 6, 7, 9, 10, 13, 14, 15})
#: A prepared statement missing (26000) or its name taken (42P05) on the server
#: connection at hand: a transaction pooler in between, most often.
_PREPARED_STATEMENT_STATES = frozenset({"26000", "42P05"})


#: SQLSTATEs of a missing object: undefined table, function, column.
_MISSING_STATES = frozenset({"42P01", "42883", "42703"})
#: SQLite's messages of the same (SQLITE_ERROR has no finer code).
_SQLITE_MISSING = re.compile(r"no such (table|column|function): |table \S+ has no column named ")


def _missing_schema(driver: BaseException, state: str | None) -> str | None:
    """What names a missing soniq table, column or function in ``driver``'s error, else None.

    Only objects whose name starts with ``soniq_`` count (a trigger of the
    project's own that reads a missing table of its own is not soniq's to
    explain). The driver's message is read here, never repeated.
    """
    primary = getattr(getattr(driver, "diag", None), "message_primary", None)
    text = primary if primary is not None else str(driver)
    if "soniq_" not in text:
        return None
    if state in _MISSING_STATES:
        return f"SQLSTATE {state}"
    if getattr(driver, "sqlite_errorname", None) == "SQLITE_ERROR" and _SQLITE_MISSING.match(text):
        return "SQLITE_ERROR"
    return None


def _unavailable(error: BaseException) -> bool:
    """Whether ``error`` says the database was unavailable, rather than that it refused."""
    driver = _driver_error(error)
    state = getattr(driver, "sqlstate", None)
    if state:
        return state[:2] in _UNAVAILABLE_CLASSES
    code = getattr(driver, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _SQLITE_UNAVAILABLE
    # No code at all (psycopg's "the connection is closed", a lost server):
    # Django's OperationalError and InterfaceError, or a bare Error, say
    # "unavailable". Psycopg's own classes carry the same names.
    if isinstance(error, DatabaseError):
        return (type(error) is DatabaseError
                or isinstance(error, (OperationalError, InterfaceError)))
    return any(cls.__name__ in ("OperationalError", "InterfaceError")
               for cls in type(error).__mro__)


def database_refused(state: str | None, constraint: str | None = None, *,
                     sqlite_name: str | None = None) -> SoniqError:
    """QUEUE_DATABASE_REFUSED naming what refused (SQLSTATE and constraint, never driver text).

    An SQLite error without a SQLSTATE equivalent is named by its result code.
    """
    where = f" on {constraint}" if constraint else ""
    what = f"SQLSTATE {state}" if state else (sqlite_name or "SQLSTATE unknown")
    return SoniqError(ErrorCode.QUEUE_DATABASE_REFUSED,
                      f"the database refused the operation ({what}{where})")


def translate(error: BaseException, alias: str | None = None) -> SoniqError:
    """The ``SoniqError`` a database error stands for; never echoes driver text.

    ``error`` is a ``django.db`` error (the driver's error as its cause) or a
    driver error itself; ``alias`` is the database alias it came from, when
    known (``MigrationsNotApplied`` names it). In this order:

    - a HINT of the SQL API (``SONIQ_…`` validation codes, ``CONFIG``) ->
      ``ConfigValidationError`` with that code; ``QUEUE_CLAIM_CONFLICT`` ->
      that code, its DETAIL naming the reason;
    - a unique violation (23505) of a job id -> DUPLICATE_JOB_ID; of a claim
      token -> QUEUE_CLAIM_CONFLICT (``nonce_reused``);
    - the database unavailable -> QUEUE_PERSISTENCE_FAILED: a SQLSTATE of
      class 08, 40, 53, 55, 57 or 58, SQLite's BUSY, LOCKED, IOERR, FULL…,
      or, without any code, Django's OperationalError or InterfaceError;
    - a soniq table, column or function missing (42P01, 42703, 42883;
      SQLite's "no such table") -> ``MigrationsNotApplied``
      (QUEUE_DATABASE_REFUSED saying which ``migrate`` to run);
    - a prepared statement missing or already there (26000, 42P05) ->
      QUEUE_DATABASE_REFUSED naming the SQLSTATE, with a hint at poolers;
    - anything else (a constraint, a trigger, a missing function or table, a
      broken enclosing transaction) -> QUEUE_DATABASE_REFUSED naming the SQLSTATE.
    """
    if isinstance(error, SoniqError):
        return error
    driver = _driver_error(error)
    diag = getattr(driver, "diag", None)
    hint = getattr(diag, "message_hint", None)
    if hint in _HINTED:
        return ConfigValidationError(_HINTED[hint], code=ErrorCode(hint))
    if hint == ErrorCode.QUEUE_CLAIM_CONFLICT:
        detail = getattr(diag, "message_detail", None)
        return SoniqError(ErrorCode.QUEUE_CLAIM_CONFLICT,
                          detail if detail in _CLAIM_REASONS else "claim_conflict")
    state, constraint = sqlstate(error), _constraint(driver)
    if state == "23505" and constraint in _JOB_IDS:
        return SoniqError(ErrorCode.DUPLICATE_JOB_ID,
                          "a job with the requested job_id already exists")
    if state == "23505" and constraint == _CLAIM_TOKEN:
        return SoniqError(ErrorCode.QUEUE_CLAIM_CONFLICT, "nonce_reused")
    if _unavailable(error):
        return SoniqError(ErrorCode.QUEUE_PERSISTENCE_FAILED, "unavailable")
    missing = _missing_schema(driver, state)
    if missing is not None:
        return MigrationsNotApplied(alias, missing)
    if state in _PREPARED_STATEMENT_STATES:
        return SoniqError(ErrorCode.QUEUE_DATABASE_REFUSED, (
            f"the database refused the operation (SQLSTATE {state}): a prepared statement is "
            "missing or taken on this server connection, as behind a transaction pooler; see "
            "docs/deployment.md"))
    if isinstance(error, TransactionManagementError):
        return SoniqError(ErrorCode.QUEUE_DATABASE_REFUSED,
                          "Django refused the query: the enclosing transaction is broken by an "
                          "earlier error, or in the wrong state (TransactionManagementError)")
    return database_refused(state, constraint,
                            sqlite_name=getattr(driver, "sqlite_errorname", None))


@contextmanager
def translating(alias: str | None = None) -> Iterator[None]:
    """Raise the ``SoniqError`` of any database error raised inside (see ``translate``)."""
    try:
        yield
    except DatabaseError as error:
        raise translate(error, alias) from None

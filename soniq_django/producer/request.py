"""What a caller asks to enqueue, and its validated form.

``JobRequest`` is the authored request (also the envelope of owned
submissions). ``prepare`` checks it exactly as SQL ``soniq_enqueue`` does,
plus what only Python can get wrong, and returns a ``PreparedJob`` whose
values are private copies ready to insert. Nothing is written before
``prepare`` succeeds, so bad input never leaves a partial row.
"""

import datetime as dt
import functools
import re
import uuid
from dataclasses import KW_ONLY, dataclass
from typing import Any, Literal, overload

from ..conf import DEFAULT_MAX_ATTEMPTS, get_settings
from ..encoding import hash_normalized_args, normalize_args
from ..errors import ConfigValidationError, ErrorCode

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
MAX_LABEL_LENGTH = 255


@dataclass(frozen=True)
class JobRequest:
    """One job to enqueue: the shape shared by ``bulk_enqueue`` and ``submit_owned``.

    ``max_attempts=None`` stores NULL, which means "use the handler's retries".
    """

    job_name: str
    args: dict[str, Any] | None = None
    _: KW_ONLY
    queue: str | None = None
    priority: int | None = None
    run_at: dt.datetime | None = None
    max_attempts: int | None = DEFAULT_MAX_ATTEMPTS
    unique_job: bool = False
    dedup_key: str | None = None
    producer_id: str | None = None
    job_id: uuid.UUID | str | None = None
    active_key: str | None = None


@dataclass(frozen=True)
class PreparedJob:
    """A validated request: every value checked, args normalized and copied."""

    job_id: uuid.UUID
    job_id_generated: bool
    job_name: str
    args: dict[str, Any]
    args_hash: str | None
    queue: str
    priority: int
    scheduled_at: dt.datetime | None
    max_attempts: int | None
    unique_job: bool
    dedup_key: str | None
    producer_id: str | None

    @property
    def deduplicates(self) -> bool:
        """Whether an equal queued job makes this one return that job's id."""
        return self.unique_job or self.dedup_key is not None


def _option(reason: str) -> ConfigValidationError:
    return ConfigValidationError(reason, code=ErrorCode.INVALID_OPTION)


@functools.lru_cache(maxsize=16)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def validate_job_name(job_name: Any, pattern: str | None = None) -> str:
    """Return ``job_name`` if it matches ``pattern`` (default: ``TASK_NAME_PATTERN``).

    Raises ``ConfigValidationError`` (INVALID_TASK_NAME) when it does not.
    """
    if type(job_name) is not str or not job_name:
        raise ConfigValidationError("the job name must be a non-empty string",
                                    code=ErrorCode.INVALID_TASK_NAME)
    if pattern is None:
        pattern = get_settings().TASK_NAME_PATTERN
    if _compiled(pattern).fullmatch(job_name) is None:
        raise ConfigValidationError(
            "the job name does not match the task-name pattern "
            "(by default lowercase words joined by dots, like billing.send_invoice)",
            code=ErrorCode.INVALID_TASK_NAME,
        )
    return job_name


def validate_max_attempts(value: Any) -> int | None:
    """Return ``value`` if it is None or an int from 1 to 2**31-1; raise INVALID_MAX_ATTEMPTS."""
    if value is None:
        return None
    if type(value) is not int or not 1 <= value <= INT32_MAX:
        raise ConfigValidationError(
            "max_attempts must be a whole number of at least 1 (retries plus one), or None",
            code=ErrorCode.INVALID_MAX_ATTEMPTS,
        )
    return value


@overload
def _label(value: Any, name: str, *, required: Literal[True]) -> str: ...
@overload
def _label(value: Any, name: str, *, required: bool) -> str | None: ...


def _label(value: Any, name: str, *, required: bool) -> str | None:
    if value is None and not required:
        return None
    if type(value) is not str or not value or len(value) > MAX_LABEL_LENGTH:
        raise _option(f"{name} must be a non-empty string of at most {MAX_LABEL_LENGTH} characters")
    if "\x00" in value:
        raise _option(f"{name} must not hold a NUL character")
    return value


def _priority(value: Any) -> int:
    if type(value) is not int or not INT32_MIN <= value <= INT32_MAX:
        raise _option("priority must be a whole number in the 32-bit integer range")
    return value


def _run_at(value: Any) -> dt.datetime | None:
    if value is None:
        return None
    if not isinstance(value, dt.datetime):
        raise _option("run_at must be a datetime")
    if value.tzinfo is None or value.utcoffset() is None:
        raise _option("run_at must be an aware datetime (with a time zone)")
    return value


def coerce_job_id(value: Any) -> uuid.UUID:
    """Return ``value`` as a UUID (from a UUID or its text); raise INVALID_OPTION."""
    if isinstance(value, uuid.UUID):
        return value
    if type(value) is str:
        try:
            return uuid.UUID(value)
        except ValueError:
            pass
    raise _option("job_id must be a UUID")


def prepare(request: JobRequest) -> PreparedJob:
    """Validate ``request`` and return what to insert, with the settings' defaults filled in.

    Raises ``ConfigValidationError`` with
    INVALID_TASK_NAME, TASK_ARGS_INVALID or INVALID_MAX_ATTEMPTS (the codes
    SQL ``soniq_enqueue`` uses), INVALID_OPTION for other options, or CONFIG
    when ``request`` is not a ``JobRequest``.
    """
    if not isinstance(request, JobRequest):
        raise ConfigValidationError("expected a JobRequest")
    config = get_settings()
    job_name = validate_job_name(request.job_name, config.TASK_NAME_PATTERN)
    args = normalize_args({} if request.args is None else request.args)
    if type(request.unique_job) is not bool:
        raise _option("unique_job must be True or False")
    queue, priority = request.queue, request.priority
    if queue is None:
        queue = config.DEFAULT_QUEUE
    if priority is None:
        priority = config.DEFAULT_PRIORITY
    generated = request.job_id is None
    return PreparedJob(
        job_id=uuid.uuid4() if generated else coerce_job_id(request.job_id),
        job_id_generated=generated,
        job_name=job_name,
        args=args,
        args_hash=hash_normalized_args(args) if request.unique_job else None,
        queue=_label(queue, "queue", required=True),
        priority=_priority(priority),
        scheduled_at=_run_at(request.run_at),
        max_attempts=validate_max_attempts(request.max_attempts),
        unique_job=request.unique_job,
        dedup_key=_label(request.dedup_key, "dedup_key", required=False),
        producer_id=_label(request.producer_id, "producer_id", required=False),
    )


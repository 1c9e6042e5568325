"""What a caller asks to enqueue, and its validated form.

``JobRequest`` is the authored request (also the envelope of owned
submissions). ``prepare`` checks it exactly as SQL ``soniq_enqueue`` does,
plus what only Python can get wrong (and the size of its args, see
``MAX_PAYLOAD_BYTES``), and returns a ``PreparedJob`` whose values are
private copies ready to insert. Nothing is written before ``prepare``
succeeds, so bad input never leaves a partial row.

A countdown (``run_at=timedelta(...)`` or ``delay=`` seconds) is kept as a
delay and turned into a time only when the row is inserted, from the
database's clock (``database_now``): workers compare ``scheduled_at`` with
that clock, so a producer host whose clock is off cannot shorten or stretch
the wait.

Every message names the option or argument it is about and, for a value of
the wrong kind, its type -- never the value itself.
"""

import dataclasses
import datetime as dt
import functools
import json
import math
import os
import re
import uuid
from collections.abc import Callable, Iterable
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Any, Literal, overload

from ..conf import DEFAULT_MAX_ATTEMPTS, checked, current_problems, get_settings
from ..encoding import encodable, hash_normalized_args, normalize_args
from ..errors import ConfigValidationError, ErrorCode, PayloadTooLarge

if TYPE_CHECKING:
    from ..keys.options import JobKey

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
MAX_LABEL_LENGTH = 255
#: The longest countdown accepted (``delay=``, ``run_at=timedelta``): a century.
MAX_DELAY = dt.timedelta(days=36525)


@dataclass(frozen=True, init=False)
class JobRequest:
    """One job to enqueue: the shape shared by ``bulk_enqueue`` and ``submit_owned``.

    ``max_attempts=None`` stores NULL, which means "use the handler's retries".
    ``run_at`` is an aware datetime, or a ``timedelta`` counted from the
    database's clock when the row is inserted; ``delay`` (seconds or a
    ``timedelta``) is the same countdown by another name. Give one of them.

    Its ``__init__`` is written out (the fields' order and defaults, which a
    test compares with the fields): the one a frozen dataclass generates
    sets each field through ``object.__setattr__``, about twice the cost,
    and a bulk enqueue makes one request per job.
    """

    job_name: str
    args: dict[str, Any] | None = None
    _: KW_ONLY
    queue: str | None = None
    priority: int | None = None
    run_at: dt.datetime | dt.timedelta | None = None
    max_attempts: int | None = DEFAULT_MAX_ATTEMPTS
    unique_job: bool = False
    dedup_key: str | None = None
    producer_id: str | None = None
    job_id: uuid.UUID | str | None = None
    active_key: str | None = None
    delay: float | dt.timedelta | None = None
    depends_on: Iterable[uuid.UUID | str] | None = None
    concurrency_key: str | None = None
    key_concurrency: int | None = None
    key_rate: str | None = None

    def __init__(self, job_name: str, args: dict[str, Any] | None = None, *,
                 queue: str | None = None, priority: int | None = None,
                 run_at: dt.datetime | dt.timedelta | None = None,
                 max_attempts: int | None = DEFAULT_MAX_ATTEMPTS, unique_job: bool = False,
                 dedup_key: str | None = None, producer_id: str | None = None,
                 job_id: uuid.UUID | str | None = None, active_key: str | None = None,
                 delay: float | dt.timedelta | None = None,
                 depends_on: Iterable[uuid.UUID | str] | None = None,
                 concurrency_key: str | None = None, key_concurrency: int | None = None,
                 key_rate: str | None = None) -> None:
        self.__dict__.update(job_name=job_name, args=args, queue=queue, priority=priority,
                             run_at=run_at, max_attempts=max_attempts, unique_job=unique_job,
                             dedup_key=dedup_key, producer_id=producer_id, job_id=job_id,
                             active_key=active_key, delay=delay, depends_on=depends_on,
                             concurrency_key=concurrency_key, key_concurrency=key_concurrency,
                             key_rate=key_rate)


@dataclass(slots=True)
class PreparedJob:
    """A validated request: every value checked, args normalized and copied.

    A countdown has ``scheduled_at`` None and its ``delay`` set until
    ``due_from`` turns it into a time; ``job_id`` is ``SERVER_MADE_ID`` when the
    database is to make the id (``prepare_to_insert``). Not frozen: one is made per job on
    the enqueue path, where a frozen dataclass's ``__init__`` costs three
    times a plain one's; only the producer holds them, and never changes one.
    """

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
    args_json: str
    """``args`` as compact JSON (UTF-8 text, not ASCII-escaped): what is measured
    against ``MAX_PAYLOAD_BYTES`` and what the PostgreSQL producer sends."""
    delay: dt.timedelta | None = None
    depends_on: tuple[uuid.UUID, ...] | None = None
    """The jobs this one waits for (each once, in the order given); None: none.
    ``any_outcome``: it waits for them to finish whatever the outcome (a batch's callback)."""
    any_outcome: bool = False
    key: "JobKey | None" = None
    """A job limited per key: its key and the limits its enqueue declares (keys/)."""

    @property
    def deduplicates(self) -> bool:
        """Whether an equal queued job makes this one return that job's id."""
        return self.unique_job or self.dedup_key is not None

    def as_json_row(self) -> dict[str, Any]:
        """The fields every set-based enqueue function's JSON element takes, as that element.

        ``soniq_enqueue_after_many`` and ``soniq_enqueue_keyed_many`` add their own.
        """
        row: dict[str, Any] = {"job_name": self.job_name, "args": self.args,
                               "queue": self.queue, "priority": self.priority,
                               "max_attempts": self.max_attempts}
        if self.scheduled_at is not None:
            row["run_at"] = self.scheduled_at.isoformat()
        if self.unique_job:
            row["unique_job"] = True
        if self.dedup_key is not None:
            row["dedup_key"] = self.dedup_key
        if self.producer_id is not None:
            row["producer_id"] = self.producer_id
        if self.job_id is not SERVER_MADE_ID:
            row["job_id"] = str(self.job_id)
        return row

    def due_from(self, now: dt.datetime) -> "PreparedJob":
        """This job with its countdown (if any) counted from ``now``."""
        if self.delay is None:
            return self
        return dataclasses.replace(self, scheduled_at=now + self.delay, delay=None)


def _option(reason: str) -> ConfigValidationError:
    return ConfigValidationError(reason, code=ErrorCode.INVALID_OPTION)


def _kind(value: Any) -> str:
    """How a message names a value it refuses: by its type, never by the value."""
    return "None" if value is None else type(value).__name__


@functools.lru_cache(maxsize=16)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _args_encoder() -> Callable[[dict[str, Any]], str]:
    """What ``json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)``
    encodes, without its per-call set-up where the C encoder is there: the
    encoder is made once, with no cycle check (``normalize_args`` returns a
    fresh tree, which has no cycles)."""
    encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - a Python built without _json
        return encoder.encode
    chunks = make(None, encoder.default, json.encoder.encode_basestring, None, ":", ",",
                  False, False, False)

    def encode(args: dict[str, Any]) -> str:
        return "".join(chunks(args, 0))

    return encode


#: Job args as the PostgreSQL producer sends them (and as their size is measured).
encode_args = _args_encoder()


def _encoded(args: dict[str, Any], limit: int | None) -> str:
    """``args`` as compact JSON; raise ``PayloadTooLarge`` over ``limit`` (``MAX_PAYLOAD_BYTES``)."""
    text = encode_args(args)
    # A character is 1 to 4 bytes of UTF-8: most args are decided without encoding.
    if limit is not None and len(text) * 4 > limit:
        size = len(text.encode("utf-8"))
        if size > limit:
            raise PayloadTooLarge(size, limit)
    return text


def validate_job_name(job_name: Any, pattern: str | None = None) -> str:
    """Return ``job_name`` if it matches ``pattern`` (default: ``TASK_NAME_PATTERN``).

    Raises ``ConfigValidationError`` (INVALID_TASK_NAME) when it does not.
    """
    if type(job_name) is not str or not job_name:
        got = "an empty one" if job_name == "" else _kind(job_name)
        raise ConfigValidationError(f"the job name must be a non-empty string, not {got}",
                                    code=ErrorCode.INVALID_TASK_NAME)
    if pattern is None:
        pattern = checked("TASK_NAME_PATTERN")
    if _compiled(pattern).fullmatch(job_name) is None:
        raise ConfigValidationError(
            "the job name does not match the task-name pattern "
            "(by default lowercase words joined by dots, like billing.send_invoice)",
            code=ErrorCode.INVALID_TASK_NAME,
        )
    if not encodable(job_name):  # a pattern may let a lone surrogate through
        raise ConfigValidationError("the job name holds a lone surrogate, which is not valid "
                                    "Unicode", code=ErrorCode.INVALID_TASK_NAME)
    return job_name


def validate_max_attempts(value: Any) -> int | None:
    """Return ``value`` if it is None or an int from 1 to 2**31-1; raise INVALID_MAX_ATTEMPTS."""
    if value is None:
        return None
    if type(value) is not int or not 1 <= value <= INT32_MAX:
        got = f"not {_kind(value)}" if type(value) is not int else (
            "not below 1" if value < 1 else "not above 2**31-1")
        raise ConfigValidationError(
            "max_attempts must be a whole number of at least 1 (retries plus one), or None; "
            + got,
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
        got = (_kind(value) if type(value) is not str
               else "an empty one" if not value else f"one of {len(value)}")
        raise _option(f"{name} must be a non-empty string of at most {MAX_LABEL_LENGTH} "
                      f"characters, not {got}")
    if "\x00" in value:
        raise _option(f"{name} must not hold a NUL character")
    if not encodable(value):
        raise _option(f"{name} holds a lone surrogate, which is not valid Unicode")
    return value


def _priority(value: Any) -> int:
    if type(value) is not int:
        raise _option(f"priority must be a whole number, not {_kind(value)}")
    if not INT32_MIN <= value <= INT32_MAX:
        raise _option("priority must be in the 32-bit integer range (-2**31 to 2**31-1)")
    return value


def _run_at(value: Any) -> dt.datetime | None:
    if value is None:
        return None
    if not isinstance(value, dt.datetime):
        raise _option(f"run_at must be an aware datetime or a timedelta, not {_kind(value)}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise _option("run_at must be an aware datetime (with a time zone), not a naive one")
    return value


def _countdown(value: Any, name: str) -> dt.timedelta:
    """A countdown: a ``timedelta`` (or, for ``delay``, seconds), from zero to ``MAX_DELAY``."""
    if isinstance(value, dt.timedelta):
        delta = value
    elif name == "delay" and type(value) in (int, float):
        if not math.isfinite(value):
            raise _option("delay must be a finite number of seconds")
        if value < 0:
            raise _option("delay must not be negative: it counts seconds from now")
        if value > MAX_DELAY.total_seconds():
            raise _option("delay must be at most a century")
        delta = dt.timedelta(seconds=value)
    else:
        raise _option(f"delay must be a number of seconds or a timedelta, not {_kind(value)}")
    if delta < dt.timedelta(0):
        raise _option(f"{name} must not be a negative timedelta: it counts from now")
    if delta > MAX_DELAY:
        raise _option(f"{name} must be at most a century from now")
    return delta


def schedule(run_at: Any, delay: Any) -> tuple[dt.datetime | None, dt.timedelta | None]:
    """Check ``run_at``/``delay``: ``(an aware datetime, None)``, ``(None, a countdown)`` or neither.

    Raises ``ConfigValidationError(INVALID_OPTION)`` for both at once, a
    naive datetime, a negative or over-long countdown, or a value of another type.
    """
    if run_at is not None and delay is not None:
        raise _option("give run_at or delay, not both")
    if delay is not None:
        return None, _countdown(delay, "delay")
    if isinstance(run_at, dt.timedelta):
        return None, _countdown(run_at, "run_at")
    return _run_at(run_at), None


def coerce_job_id(value: Any) -> uuid.UUID:
    """Return ``value`` as a UUID (from a UUID or its text); raise INVALID_OPTION."""
    if isinstance(value, uuid.UUID):
        return value
    if type(value) is str:
        try:
            return uuid.UUID(value)
        except ValueError:
            raise _option("job_id must be a UUID, and this text is not one") from None
    raise _option(f"job_id must be a UUID (or its text), not {_kind(value)}")


def _check_settings_used(request: JobRequest) -> None:
    """Raise ``SettingsInvalid`` for a bad setting that ``request`` needs (and only those)."""
    checked("TASK_NAME_PATTERN")
    checked("MAX_PAYLOAD_BYTES")
    if request.queue is None:
        checked("DEFAULT_QUEUE")
    if request.priority is None:
        checked("DEFAULT_PRIORITY")


def prepare(request: JobRequest) -> PreparedJob:
    """Validate ``request`` and return what to insert, with the settings' defaults filled in.

    Raises ``ConfigValidationError`` with
    INVALID_TASK_NAME, TASK_ARGS_INVALID or INVALID_MAX_ATTEMPTS (the codes
    SQL ``soniq_enqueue`` uses), INVALID_OPTION for other options, CONFIG
    when ``request`` is not a ``JobRequest``, and ``PayloadTooLarge``
    (PAYLOAD_TOO_LARGE) for args over ``MAX_PAYLOAD_BYTES``;
    ``SettingsInvalid`` when a setting it needs is one the system checks reject.
    """
    return _prepare(request, uuid.uuid4)


def _prepare(request: JobRequest, new_id: Callable[[], uuid.UUID],
             valid_names: set[str] | None = None) -> PreparedJob:
    """``prepare``, with ``new_id()`` giving the id of a request that names none.

    ``valid_names``: job names already found valid under the current settings
    (a batch's), not checked again; a name found valid is added.
    """
    if not isinstance(request, JobRequest):
        raise ConfigValidationError(f"expected a JobRequest, not {_kind(request)}")
    if current_problems():
        _check_settings_used(request)
    config = get_settings()
    job_name = request.job_name
    if valid_names is None or type(job_name) is not str or job_name not in valid_names:
        job_name = validate_job_name(job_name, config.TASK_NAME_PATTERN)
        if valid_names is not None:
            valid_names.add(job_name)
    args = normalize_args({} if request.args is None else request.args)
    args_json = _encoded(args, config.MAX_PAYLOAD_BYTES)
    unique_job = request.unique_job
    if type(unique_job) is not bool:
        raise _option(f"unique_job must be True or False, not {_kind(unique_job)}")
    queue, priority = request.queue, request.priority
    if queue is None:
        queue = config.DEFAULT_QUEUE
    if priority is None:
        priority = config.DEFAULT_PRIORITY
    requested = request.job_id
    run_at, delay = request.run_at, request.delay
    if run_at is not None or delay is not None:
        run_at, delay = schedule(run_at, delay)
    job_id = new_id() if requested is None else coerce_job_id(requested)
    args_hash = hash_normalized_args(args) if unique_job else None
    # The checks in the order they always ran. The usual values pass a cheap test; the
    # rest go through the checks that say why not.
    if (type(queue) is not str or not 0 < len(queue) <= MAX_LABEL_LENGTH or "\x00" in queue
            or not queue.isascii()):
        queue = _label(queue, "queue", required=True)
    if type(priority) is not int or not INT32_MIN <= priority <= INT32_MAX:
        priority = _priority(priority)
    max_attempts = request.max_attempts
    if type(max_attempts) is not int or not 1 <= max_attempts <= INT32_MAX:
        max_attempts = validate_max_attempts(max_attempts)
    dedup_key, producer_id = request.dedup_key, request.producer_id
    if dedup_key is not None:
        dedup_key = _label(dedup_key, "dedup_key", required=False)
    if producer_id is not None:
        producer_id = _label(producer_id, "producer_id", required=False)
    depends_on = request.depends_on
    if depends_on is not None:
        depends_on = dependency_ids(depends_on)
    # In the fields' order, positionally: fourteen keywords cost more than the rest of
    # the call (a test compares the result field by field).
    prepared = PreparedJob(job_id, requested is None, job_name, args, args_hash, queue,
                           priority, run_at, max_attempts, unique_job, dedup_key, producer_id,
                           args_json, delay, depends_on)
    if (request.concurrency_key is not None or request.key_concurrency is not None
            or request.key_rate is not None):
        prepared.key = _job_key(request)
    return prepared


def _job_key(request: JobRequest) -> "JobKey":
    """The checked key options of ``request`` (``ConfigValidationError(INVALID_OPTION)``)."""
    from ..keys.options import JobKey, check_key, normal_rate

    if request.concurrency_key is None:
        raise _option("key_concurrency and key_rate need a concurrency_key")
    key = check_key(request.concurrency_key)
    limit = request.key_concurrency
    if limit is not None and (type(limit) is not int or not 1 <= limit <= INT32_MAX):
        raise _option(f"key_concurrency must be a whole number from 1 to {INT32_MAX}, or None")
    rate = request.key_rate
    if rate is not None:
        try:
            rate = normal_rate(rate)
        except ValueError as error:
            raise _option(f"key_rate: {error}") from None
    return JobKey(key, limit, rate)


#: The most jobs one job may depend on (``soniq_enqueue_after`` refuses more).
MAX_DEPENDENCIES = 1000


def dependency_ids(value: Any) -> tuple[uuid.UUID, ...]:
    """``depends_on`` as a tuple of UUIDs, each once, in the order given.

    Raises ``ConfigValidationError(INVALID_OPTION)`` for a string or mapping
    (not a list of ids), an id that is not a UUID, or more than ``MAX_DEPENDENCIES``.
    """
    if isinstance(value, (str, bytes, dict)) or not isinstance(value, Iterable):
        raise _option(f"depends_on must be a list of job ids, not {_kind(value)}")
    ids: dict[uuid.UUID, None] = {}
    for item in value:
        try:
            ids[coerce_job_id(item)] = None
        except ConfigValidationError:
            raise _option("depends_on must hold job ids (UUIDs or their text), and one "
                          "of them is not") from None
    if len(ids) > MAX_DEPENDENCIES:
        raise _option(f"depends_on may name at most {MAX_DEPENDENCIES} jobs")
    return tuple(ids)


#: The ``job_id`` of a job whose id the database makes: ``soniq_enqueue`` is called with
#: job_id NULL and returns the id it drew (``gen_random_uuid()``, version 4 as
#: ``uuid.uuid4``). ``enqueue()`` asks for it (``server_made``), where nobody sees the
#: id before the insert; the portable path draws one there instead. Compared by identity:
#: no caller can pass this object.
SERVER_MADE_ID = uuid.UUID(int=0)


def server_made() -> uuid.UUID:
    """The ``new_id`` of ``_prepare`` for a job whose id the database makes."""
    return SERVER_MADE_ID


def prepare_to_insert(request: JobRequest) -> PreparedJob:
    """``prepare`` for an insert that returns the id: one the request names none of is
    left to the database (``SERVER_MADE_ID``). Not for a caller that needs the id
    before the insert (``enqueue_on_commit``, the Tasks backend)."""
    return _prepare(request, server_made)


def prepare_all(requests: Iterable[JobRequest]) -> list[PreparedJob]:
    """``prepare`` each request of a bulk enqueue; ``PayloadTooLarge`` names the request's index."""
    prepared: list[PreparedJob] = []
    append = prepared.append
    new_id, valid_names = _fresh_ids(), set[str]()
    for index, request in enumerate(requests):
        try:
            append(_prepare(request, new_id, valid_names))
        except PayloadTooLarge as error:
            raise error.at(index) from None
    return prepared


#: How many random ids ``_fresh_ids`` draws from the system at a time.
_ID_BATCH = 256

# What ``uuid.UUID(bytes=..., version=4)`` does to the random bits: the RFC 4122
# variant, version 4.
_ID_KEEP = ~((0xC000 << 48) | (0xF000 << 64))
_ID_SET = (0x8000 << 48) | (4 << 76)
# A UUID is made from its integer as ``UUID.__init__`` makes it, without that
# method's argument checks (about 1 µs an id), while ``UUID`` keeps these slots.
_UUID_SLOTS = {"int", "is_safe"} <= set(getattr(uuid.UUID, "__slots__", ()))


def _fresh_ids() -> Callable[[], uuid.UUID]:
    """A source of version-4 UUIDs, as ``uuid.uuid4`` makes them, drawing ``os.urandom``
    once per ``_ID_BATCH`` ids instead of once per id."""
    pool: list[int] = []
    make, new, put, unknown = uuid.UUID, object.__new__, object.__setattr__, uuid.SafeUUID.unknown

    def new_id() -> uuid.UUID:
        if not pool:
            random = os.urandom(16 * _ID_BATCH)
            pool.extend(int.from_bytes(random[i:i + 16], "big") & _ID_KEEP | _ID_SET
                        for i in range(16 * (_ID_BATCH - 1), -1, -16))
        value = pool.pop()
        if not _UUID_SLOTS:  # pragma: no cover - a uuid module laid out otherwise
            return make(int=value)
        made: uuid.UUID = new(make)
        put(made, "int", value)
        put(made, "is_safe", unknown)
        return made

    return new_id

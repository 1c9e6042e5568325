"""The ``SONIQ`` settings: one typed, frozen snapshot of ``settings.SONIQ``.

``get_settings()`` returns the snapshot: every key with its default filled
in. It is built on first use and again after ``settings.SONIQ`` changes
through ``override_settings`` or pytest-django's ``settings`` fixture (both
send Django's ``setting_changed``), so reading it costs one global lookup.
Values are the project's own, never converted: the system checks
(``soniq.E001``-``E004``) report a wrong type or an unknown key; reading
never fails. Nothing is ever written to ``django.conf.settings``.

The rules of each value live here (``problems``), for two readers: the
system checks, which report every problem, and ``checked(key)``, which
code calls where it *uses* a value -- so that a bad setting never breaks
an import (a decorator leaves settings alone) and its first use raises
``SettingsInvalid`` naming the key and the check, not a confusing error
about something else.
"""

import dataclasses
import numbers
import re
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from .errors import SettingsInvalid

DEFAULT_TASK_NAME_PATTERN = r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$"

#: Attempts a job gets when nobody says otherwise: the default ``max_attempts``
#: of ``enqueue()`` and ``JobRequest`` (SPEC §5), the column default of the job
#: tables, the limit of a NULL ``max_attempts`` without a registered handler
#: (soniq_fail's ``default_max_attempts``), and ``DEFAULT_MAX_ATTEMPTS``'s default.
DEFAULT_MAX_ATTEMPTS = 4

#: How long after it was enqueued a job whose name no worker knows is deferred
#: before it is dead-lettered as job_not_found: longer than a rolling deploy
#: takes (docs/deployment.md#rolling-deploys says why ten minutes).
DEFAULT_UNKNOWN_JOB_GRACE_SECONDS = 600

#: The largest job args ``enqueue()`` accepts, as compact UTF-8 JSON: 1 MiB
#: (docs/settings.md says why).
DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
#: The largest result of a durable step, as JSON text: 64 KiB (docs/steps.md says why).
DEFAULT_STEP_MAX_BYTES = 64 * 1024
#: The largest STEP_MAX_BYTES the SQL function accepts: 64 MiB.
STEP_MAX_BYTES_LIMIT = 64 * 1024 * 1024


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """``settings.SONIQ`` as read once: the documented keys (docs/settings.md) and defaults."""

    LEASE_SECONDS: float = 30
    HEARTBEAT_SECONDS: float = 10
    POLL_INTERVAL: float = 5
    RESULT_TTL: float = 300
    TASK_NAME_PATTERN: str = DEFAULT_TASK_NAME_PATTERN
    DEFAULT_QUEUE: str = "default"
    DEFAULT_PRIORITY: int = 100
    DEFAULT_MAX_ATTEMPTS: int = DEFAULT_MAX_ATTEMPTS
    RETRY_BASE_SECONDS: float = 2
    RETRY_MAX_SECONDS: float = 3600
    JOB_TIMEOUT_SECONDS: float | None = None
    REQUIRE_SQL_API: bool = False
    PREPARED_STATEMENTS: bool | None = None
    IMPORTS: tuple[str, ...] | list[str] = ()
    UNKNOWN_JOB_GRACE_SECONDS: float = DEFAULT_UNKNOWN_JOB_GRACE_SECONDS
    LISTEN_DATABASE: str | None = None
    MAX_PAYLOAD_BYTES: int | None = DEFAULT_MAX_PAYLOAD_BYTES
    STEP_MAX_BYTES: int = DEFAULT_STEP_MAX_BYTES
    """The largest result ``current_job().step`` records, in bytes of JSON text (steps/)."""
    QUEUES: Any = dataclasses.field(default_factory=dict)
    """Flow control per queue (soniq.E011 checks it; flow.py applies it)."""
    METRICS_ACCESS: str = "staff"
    """Who may read ``metrics_view``: "staff", "token" or "open" (metrics/view.py)."""
    METRICS_TOKEN: str | None = None
    """The bearer token of ``METRICS_ACCESS = "token"`` (never logged, never shown)."""
    METRICS_CACHE_SECONDS: float = 10
    """How long the queue-level figures of one read are served again (0: read at each scrape)."""
    METRICS_MAX_QUEUES: int = 100
    """The most queue label values a series has; the other queues are summed as "__other__"."""
    REBUILD_INDEXES_AFTER_PIN: bool = True
    """PostgreSQL: workers rebuild the soniq_jobs indexes a pinned horizon left bloated
    (index_rebuild.py, decision 0037)."""

    configured: frozenset[str] = frozenset()
    """Every key the project set, known or not (the checks name the unknown ones)."""
    is_dict: bool = True
    """False when ``settings.SONIQ`` is not a dict; every key then has its default."""


#: The keys of ``settings.SONIQ``, in the order of docs/settings.md.
KEYS = tuple(field.name for field in dataclasses.fields(Settings) if field.name.isupper())
_KNOWN = frozenset(KEYS)

_current: Settings | None = None
_UNSET = object()


def _read() -> Settings:
    raw = getattr(settings, "SONIQ", _UNSET)
    if raw is _UNSET:
        return Settings()
    if not isinstance(raw, dict):
        return Settings(is_dict=False)
    known = {key: value for key, value in raw.items() if key in _KNOWN}
    return Settings(**known, configured=frozenset(raw))


def get_settings() -> Settings:
    """The current settings snapshot (rebuilt after ``settings.SONIQ`` changes)."""
    global _current
    current = _current
    if current is None:
        current = _current = _read()
    return current


@receiver(setting_changed)  # type: ignore[untyped-decorator]  # Django's, untyped here
def _forget(*, setting: str, **kwargs: Any) -> None:
    global _current, _problems
    if setting == "SONIQ":
        _current = _problems = None


# --------------------------------------------------------------------------
# The rules of the values


@dataclasses.dataclass(frozen=True)
class Problem:
    """What is wrong with one key's value: the system check's id, message and hint."""

    key: str
    check_id: str
    message: str
    hint: str | None = None


_POSITIVE = ("LEASE_SECONDS", "HEARTBEAT_SECONDS", "POLL_INTERVAL")
_NOT_NEGATIVE = ("RESULT_TTL", "RETRY_BASE_SECONDS", "RETRY_MAX_SECONDS",
                 "UNKNOWN_JOB_GRACE_SECONDS", "METRICS_CACHE_SECONDS")
#: What ``METRICS_ACCESS`` may be (docs/metrics.md, decision 0039).
METRICS_ACCESS_MODES = ("staff", "token", "open")
#: The shortest ``METRICS_TOKEN``: a bearer token must not be guessable.
MIN_METRICS_TOKEN = 16
_INTEGERS = ("DEFAULT_PRIORITY", "DEFAULT_MAX_ATTEMPTS")
_DEFAULT = Settings()


def _number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _problem(key: str, message: str, hint: str | None = None, check_id: str = "soniq.E003"
             ) -> Problem:
    return Problem(key, check_id, message, hint)


def _value_problem(config: Settings, key: str) -> Problem | None:
    value = getattr(config, key)
    default = getattr(_DEFAULT, key)
    if key in _POSITIVE and not (_number(value) and value > 0):
        return _problem(key, f"SONIQ[{key!r}] must be a positive number of seconds.",
                        f"The default is {default}.")
    if key in _NOT_NEGATIVE and not (_number(value) and value >= 0):
        return _problem(key, f"SONIQ[{key!r}] must be a number of seconds, 0 or more.",
                        f"The default is {default}.")
    if key in _INTEGERS and type(value) is not int:
        return _problem(key, f"SONIQ[{key!r}] must be a whole number.", f"The default is {default}.")
    if key == "DEFAULT_MAX_ATTEMPTS" and value < 1:
        return _problem(key, "SONIQ['DEFAULT_MAX_ATTEMPTS'] must be at least 1.",
                        "It counts the first attempt too.")
    if key == "JOB_TIMEOUT_SECONDS" and value is not None and not (_number(value) and value > 0):
        return _problem(key, "SONIQ['JOB_TIMEOUT_SECONDS'] must be None or a positive number.")
    if key == "REBUILD_INDEXES_AFTER_PIN" and type(value) is not bool:
        return _problem(key, "SONIQ['REBUILD_INDEXES_AFTER_PIN'] must be True or False.",
                        "The default is True.")
    if key == "PREPARED_STATEMENTS" and value is not None and type(value) is not bool:
        return _problem(key, "SONIQ['PREPARED_STATEMENTS'] must be None, True or False.",
                        "None (the default) prepares them only on a connection straight to the "
                        "server.")
    if key == "DEFAULT_QUEUE" and (not isinstance(value, str) or not value or len(value) > 255):
        return _problem(key, "SONIQ['DEFAULT_QUEUE'] must be a queue name (1-255 characters).")
    if key == "IMPORTS" and (not isinstance(value, (list, tuple)) or not all(
            isinstance(name, str) and name for name in value)):
        return _problem(key, "SONIQ['IMPORTS'] must be a list of module names.",
                        'For example ["shop.tasks", "billing.handlers"].')
    if key == "MAX_PAYLOAD_BYTES" and value is not None and not (
            type(value) is int and value >= 1):
        return _problem(key, "SONIQ['MAX_PAYLOAD_BYTES'] must be None or a whole number of "
                             "bytes, at least 1.", f"The default is {default} (1 MiB).")
    if key == "STEP_MAX_BYTES" and not (
            type(value) is int and 1 <= value <= STEP_MAX_BYTES_LIMIT):
        return _problem(key, "SONIQ['STEP_MAX_BYTES'] must be a whole number of bytes from 1 "
                             "to 67108864 (64 MiB).", f"The default is {default} (64 KiB).")
    if key == "METRICS_ACCESS" and value not in METRICS_ACCESS_MODES:
        return _problem(key, "SONIQ['METRICS_ACCESS'] must be \"staff\", \"token\" or \"open\".",
                        'The default is "staff": logged-in staff who may view jobs.')
    if key == "METRICS_TOKEN" and (
            (value is not None and not isinstance(value, str))
            or (config.METRICS_ACCESS == "token"
                and not (isinstance(value, str) and len(value) >= MIN_METRICS_TOKEN))):
        return _problem(key, f"SONIQ['METRICS_TOKEN'] must be a string of at least "
                             f"{MIN_METRICS_TOKEN} characters when METRICS_ACCESS is \"token\".",
                        "For example secrets.token_urlsafe(32), read from the environment.")
    if key == "METRICS_MAX_QUEUES" and not (type(value) is int and value >= 1):
        return _problem(key, "SONIQ['METRICS_MAX_QUEUES'] must be a whole number, at least 1.",
                        f"The default is {default}.")
    if key == "TASK_NAME_PATTERN":
        try:
            re.compile(value)
        except (re.error, TypeError):
            return _problem(key, "SONIQ['TASK_NAME_PATTERN'] is not a valid regular expression.",
                            check_id="soniq.E004")
    return None


def problems(config: Settings) -> list[Problem]:
    """Every key of ``config`` whose value the system checks reject (E003, E004), in ``KEYS`` order.

    ``LISTEN_DATABASE`` is the pooler checks' (``pooling.settings_messages``):
    whether it is right depends on ``DATABASES`` too.
    """
    found = (_value_problem(config, key) for key in KEYS)
    return [problem for problem in found if problem is not None]


_problems: dict[str, Problem] | None = None


def current_problems() -> dict[str, Problem]:
    """``problems(get_settings())`` by key, worked out once per snapshot (usually empty)."""
    global _problems
    found = _problems
    if found is None:
        found = _problems = {problem.key: problem for problem in problems(get_settings())}
    return found


def checked(key: str) -> Any:
    """The value of ``SONIQ[key]`` for code about to use it.

    Raises ``SettingsInvalid`` (code SETTINGS_INVALID, also an
    ``ImproperlyConfigured``) naming the key, its value's type and the
    system check that reports it, when the checks reject the value.
    """
    problem = current_problems().get(key)
    value = getattr(get_settings(), key)
    if problem is not None:
        raise invalid(problem, value)
    return value


def invalid(problem: Problem, value: Any) -> SettingsInvalid:
    """The ``SettingsInvalid`` of ``problem``: the check's message and the value's type, never
    the value itself (a setting may hold a secret)."""
    return SettingsInvalid(problem.key, problem.check_id,
                           f"{problem.message[:-1]} (got a value of type {type(value).__name__}); "
                           f"manage.py check reports it as {problem.check_id}")

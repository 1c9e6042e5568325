"""The ``SONIQ`` settings: one typed, frozen snapshot of ``settings.SONIQ``.

``get_settings()`` returns the snapshot: every key with its default filled
in. It is built on first use and again after ``settings.SONIQ`` changes
through ``override_settings`` or pytest-django's ``settings`` fixture (both
send Django's ``setting_changed``), so reading it costs one global lookup.
Values are the project's own, never converted: the system checks
(``soniq.E001``-``E004``) report a wrong type or an unknown key; reading
never fails. Nothing is ever written to ``django.conf.settings``.
"""

import dataclasses
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

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
    global _current
    if setting == "SONIQ":
        _current = None

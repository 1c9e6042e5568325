"""One lazy accessor over ``settings.SONIQ``.

Values are read on every access, so ``override_settings(SONIQ=...)`` works in
tests. Nothing is ever written to ``django.conf.settings``.
"""

from typing import Any

from django.conf import settings

DEFAULT_TASK_NAME_PATTERN = r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$"

DEFAULTS: dict[str, Any] = {
    "LEASE_SECONDS": 30,
    "HEARTBEAT_SECONDS": 10,
    "POLL_INTERVAL": 5,
    "RESULT_TTL": 300,
    "TASK_NAME_PATTERN": DEFAULT_TASK_NAME_PATTERN,
    "DEFAULT_QUEUE": "default",
    "DEFAULT_PRIORITY": 100,
    "DEFAULT_MAX_ATTEMPTS": 4,
    "RETRY_BASE_SECONDS": 2,
    "RETRY_MAX_SECONDS": 3600,
    "JOB_TIMEOUT_SECONDS": None,
    "REQUIRE_SQL_API": False,
    "PREPARED_STATEMENTS": None,
}


def configured() -> dict:
    """``settings.SONIQ`` as the project set it (read anew on every call); {} when unset.

    A caller that needs several values at once (a batch of jobs) reads it once
    and uses ``.get(name, DEFAULTS[name])``.
    """
    return getattr(settings, "SONIQ", None) or {}


class SoniqSettings:
    """Attribute access to the ``SONIQ`` settings dict with documented defaults."""

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"unknown soniq setting {name!r}")
        return configured().get(name, DEFAULTS[name])

    def user_keys(self) -> set[str]:
        """The keys the project set in ``settings.SONIQ``."""
        return set(configured().keys())


soniq_settings = SoniqSettings()

"""Which time limit a job's run has, where it comes from, and how its timeout reads.

One limit per job name, first found of: the handler's own
(``@job(timeout=...)``; for a Django task, its backend's
``OPTIONS["timeout"]``), then ``SONIQ["JOB_TIMEOUT_SECONDS"]``; None: no
limit. A run's deadline is its claim plus the limit (``InFlight.started``).
"""

from dataclasses import dataclass

from ..conf import get_settings
from ..registry import get_handler

SETTING = "SONIQ['JOB_TIMEOUT_SECONDS']"


@dataclass(frozen=True)
class TimeLimit:
    """How long one run of a job may take, and which setting says so."""

    seconds: float
    origin: str
    """Where the limit is set, as ``last_error`` names it: ``@job(timeout=...)``, the setting,
    or a Tasks backend's option."""

    def deadline(self, started: float) -> float:
        """The ``time.monotonic()`` at which a run claimed at ``started`` times out."""
        return started + self.seconds

    def remaining(self, started: float | None, now: float) -> float:
        """Seconds left to a run claimed at ``started`` (the whole limit when unknown)."""
        return self.seconds if started is None else self.deadline(started) - now

    def error(self, *, atomic: bool = False) -> str:
        """The failure a timed-out run records (``last_error``; its first line is logged)."""
        text = f"timed out after {seconds_text(self.seconds)} s ({self.origin})"
        return text + ("; the writes of this atomic run are rolled back" if atomic else "")


def seconds_text(seconds: float) -> str:
    """``1`` for 1.0, ``0.3`` for 0.3: the number as the project wrote it."""
    value = float(seconds)
    return str(int(value)) if value.is_integer() else repr(value)


def limit_for(job_name: str) -> TimeLimit | None:
    """The time limit of a run of ``job_name`` in this process; None: it has none."""
    handler = get_handler(job_name)
    own = getattr(handler, "timeout", None) if handler is not None else None
    if own is not None:
        origin = getattr(handler, "timeout_origin", None) or (
            f"@job(timeout={seconds_text(own)})")
        return TimeLimit(float(own), origin)
    setting = get_settings().JOB_TIMEOUT_SECONDS
    if setting is None:
        return None
    return TimeLimit(float(setting), SETTING)

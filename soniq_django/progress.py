"""A job's progress: what ``current_job().set_progress()`` takes, and how it is read back.

The value is checked here (``checked``), in the handler's own call, so bad
input raises there with a clear reason; it is written later, coalesced
(worker/progress.py), by ``soniq_set_progress`` under the claim's fence
(``OwnedJobSource.set_progress_owned``). ``JobInfo.progress`` is ``None`` or
the dict ``as_dict`` makes. See docs/workflows.md#progress.
"""

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

from .errors import ConfigValidationError

#: The longest note, in characters (the SQL function says the same).
MAX_NOTE = 1000
#: The largest count: PostgreSQL's bigint.
MAX_COUNT = 2**63 - 1


@dataclass(frozen=True, slots=True)
class Progress:
    """One reported value: ``done`` of ``total`` (None: unknown), with an optional note."""

    done: int
    total: int | None
    note: str | None


def _count(value: Any, name: str, *, optional: bool) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        kind = "None or " if optional else ""
        raise ConfigValidationError(
            f"set_progress: {name} must be {kind}an integer >= 0, not {type(value).__name__}")
    if value < 0 or value > MAX_COUNT:
        raise ConfigValidationError(
            f"set_progress: {name} must be an integer from 0 to 2**63-1")
    return int(value)


def checked(done: Any, total: Any = None, note: Any = None) -> Progress:
    """The value ``set_progress(done, total, note)`` reports; ``ConfigValidationError`` (CONFIG)
    for counts that are not integers ≥ 0 (booleans are not) or a note that is not a string of
    at most ``MAX_NOTE`` characters without NUL or lone surrogates."""
    counted = _count(done, "done", optional=False)
    assert counted is not None
    of = _count(total, "total", optional=True)
    if note is not None:
        if not isinstance(note, str):
            raise ConfigValidationError(
                f"set_progress: note must be None or a string, not {type(note).__name__}")
        if len(note) > MAX_NOTE:
            raise ConfigValidationError(
                f"set_progress: note is {len(note)} characters; at most {MAX_NOTE} are kept")
        if "\x00" in note:
            raise ConfigValidationError("set_progress: note holds a NUL character")
        try:
            note.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigValidationError(
                "set_progress: note holds a lone surrogate (UTF-8 cannot encode it)") from None
    return Progress(counted, of, note)


def as_dict(done: int, total: int | None, note: str | None, updated_at: dt.datetime
            ) -> dict[str, Any]:
    """``JobInfo.progress``: ``{"done", "total", "note", "updated_at"}``."""
    return {"done": int(done), "total": None if total is None else int(total), "note": note,
            "updated_at": updated_at}


def read(job_id: uuid.UUID, alias: str) -> dict[str, Any] | None:
    """The progress recorded for ``job_id`` on ``alias`` (through the ORM), or None."""
    from .models import JobProgress

    row = (JobProgress.objects.using(alias).filter(job_id=job_id)
           .values_list("done", "total", "note", "updated_at").first())
    return None if row is None else as_dict(*row)

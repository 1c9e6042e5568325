"""Values of the owned queue: the fence, a claimed job, a state snapshot.

Also the validation every owned call applies before touching the database:
identities are non-empty strings of at most 255 characters compared
exactly (no trimming, case folding or normalisation), booleans are never
accepted as integers, and numbers stay within their SQL ranges.
"""

import datetime as dt
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..encoding import encodable
from ..errors import ConfigValidationError, ErrorCode, SoniqError

MAX_IDENTITY = 255
MAX_JOB_ID = 36
MAX_DLQ_RECORD_ID = 32
INT32_MAX = 2**31 - 1
MAX_CLAIM_BATCH = 1000  # nonces one soniq_claim_many call may carry
INT64_MAX = 2**63 - 1
#: UUID text as every claim writes it into a fence (what ``str(uuid.UUID(...))`` gives).
_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass(frozen=True, slots=True)
class QueueClaimFence:
    """Proof of one claim: present it unchanged to every later owned operation.

    ``job_id`` is the job's canonical UUID text. The claim token is a secret
    of the claiming worker and never appears in ``repr``.
    """

    queue: str
    job_id: str
    worker_id: str
    generation: int
    claim_token: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A job claimed by ``claim_next_owned`` (or found by ``recover_owned_claim``)."""

    job_id: uuid.UUID
    job_name: str
    args: dict[str, Any]
    queue: str
    priority: int
    attempts: int
    max_attempts: int | None
    lease_expires_at: dt.datetime
    claim_fence: QueueClaimFence


@dataclass(frozen=True, slots=True)
class OwnedJobState:
    """A snapshot of a live claim's cancel request and pid; not an authority."""

    cancel_requested: bool
    pid: int | None


def identity(value: Any, what: str) -> str:
    """Return ``value`` if it is a non-empty str of at most 255 characters; else raise CONFIG."""
    if type(value) is not str or not value or len(value) > MAX_IDENTITY:
        raise ConfigValidationError(
            f"{what} must be a non-empty string of at most {MAX_IDENTITY} characters"
        )
    if "\x00" in value:
        raise ConfigValidationError(f"{what} must not hold a NUL character")
    if not encodable(value):
        raise ConfigValidationError(f"{what} holds a lone surrogate, which is not valid Unicode")
    return value


def queue_names(queues: Any) -> list[str] | None:
    """Return ``queues`` as a list of queue names, or None (every queue); else raise CONFIG.

    What a claim (and a worker's ``--queues``) serves: None, or at least one
    non-empty string that the database can store.
    """
    if queues is None:
        return None
    if isinstance(queues, str) or not all(type(q) is str and q for q in queues):
        raise ConfigValidationError("queues must be a list of queue names, or None")
    names = list(queues)
    if not names:
        raise ConfigValidationError("queues must name at least one queue, or be None")
    if not all(map(encodable, names)):
        raise ConfigValidationError("a queue name holds a lone surrogate, which is not valid "
                                    "Unicode")
    return names


def positive_int(value: Any, what: str, maximum: int) -> int:
    """Return ``value`` if it is an int (not a bool) from 1 to ``maximum``; else raise CONFIG."""
    if type(value) is not int or not 1 <= value <= maximum:
        raise ConfigValidationError(f"{what} must be a whole number from 1 to {maximum}")
    return value


def fence(value: Any) -> QueueClaimFence:
    """Check a fence's shape before any I/O; raise CONFIG when it is not a valid fence.

    A job id that is not UUID text cannot be looked up in a native UUID
    column; like the database, that raises QUEUE_PERSISTENCE_FAILED
    (``unavailable``) -- it is not evidence that the claim is gone.
    """
    if type(value) is not QueueClaimFence:
        raise ConfigValidationError("expected the QueueClaimFence returned by a claim")
    identity(value.queue, "fence queue")
    identity(value.worker_id, "fence worker_id")
    identity(value.claim_token, "fence claim_token")
    positive_int(value.generation, "fence generation", INT64_MAX)
    if type(value.job_id) is not str or not value.job_id or len(value.job_id) > MAX_JOB_ID:
        raise ConfigValidationError("fence job_id must be UUID text of at most 36 characters")
    if _CANONICAL_UUID.fullmatch(value.job_id):  # a claim's own fence: no UUID to build
        return value
    try:
        uuid.UUID(value.job_id)
    except ValueError:
        raise SoniqError(ErrorCode.QUEUE_PERSISTENCE_FAILED, "unavailable") from None
    return value

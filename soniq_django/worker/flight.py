"""A job a worker is running, from its claim to its final write."""

import threading
import time
from dataclasses import dataclass, field

from ..owned.types import ClaimedJob
from .context import JobContext
from .execution import Outcome


@dataclass
class InFlight:
    """A job this worker is running."""

    claimed: ClaimedJob
    context: JobContext
    started: float = field(default_factory=time.monotonic)
    settled: threading.Lock = field(default_factory=threading.Lock)
    done: bool = False
    lost: bool = False
    outcome: Outcome | None = None  # a completion waiting for the main loop to write it

    @property
    def key(self) -> tuple[str, int]:
        """This run's identity: the job id and the claim's generation.

        One job can be in flight twice in one worker -- a run whose lease
        lapsed while its handler keeps going, and the next claim of the same
        job -- so flights are kept by claim, never by job id alone.
        """
        fence = self.claimed.claim_fence
        return fence.job_id, fence.generation

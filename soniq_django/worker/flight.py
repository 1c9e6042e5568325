"""A job a worker is running, from its claim to its final write."""

import threading
import time
from dataclasses import dataclass, field

from ..owned_types import ClaimedJob
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

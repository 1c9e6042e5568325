"""How many jobs a worker may take: its free slots, and what is left of ``max_jobs``."""

import threading


class Slots:
    """``size`` job threads' worth of slots.

    Only the main loop takes slots (one per job its round claimed); a job
    thread gives its slot back when it has no next job to run. So the free
    count the loop reads can only grow until the loop itself takes.
    """

    def __init__(self, size: int):
        self._lock = threading.Lock()
        self._free = size

    @property
    def free(self) -> int:
        return self._free

    def take(self, count: int) -> None:
        with self._lock:
            if count > self._free:
                raise RuntimeError(f"took {count} slots, {self._free} free")
            self._free -= count

    def give(self) -> None:
        with self._lock:
            self._free += 1


class Budget:
    """``max_jobs`` (None: no limit), shared by every thread that claims.

    A claim reserves what it asks for before the call and accounts for the
    answer after it, so claims made at once by the main loop and the
    inline completer never pass the limit together.
    """

    def __init__(self, max_jobs: int | None):
        self.max_jobs = max_jobs
        self._lock = threading.Lock()
        self.claimed = 0
        self.reserved = 0  # claims under way, counted against max_jobs until they answer

    @property
    def left(self) -> int | None:
        """Claims still allowed, reservations counted (None: no limit)."""
        if self.max_jobs is None:
            return None
        with self._lock:
            return self.max_jobs - self.claimed - self.reserved

    @property
    def reached(self) -> bool:
        """``max_jobs`` jobs were claimed (answered claims only)."""
        return self.max_jobs is not None and self.claimed >= self.max_jobs

    def reserve(self, wanted: int) -> int:
        """How many of ``wanted`` claims may be made without passing ``max_jobs``; reserves them."""
        with self._lock:
            if self.max_jobs is not None:
                wanted = max(0, min(wanted, self.max_jobs - self.claimed - self.reserved))
            self.reserved += wanted
            return wanted

    def account(self, reserved: int, claimed: int) -> None:
        """A claim of ``reserved`` jobs answered with ``claimed`` of them."""
        with self._lock:
            self.reserved -= reserved
            self.claimed += claimed

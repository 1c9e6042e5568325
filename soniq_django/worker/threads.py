"""A worker's job threads: ``size`` threads that each run the jobs handed to them.

Not a ``ThreadPoolExecutor``: the worker needs no future per job (a job
thread settles its own job), and a future is a condition variable, a work
item and an idle-thread semaphore per job. Here a job is one put on a
queue. Threads start one per job handed over until there are ``size`` of
them; the main loop never hands over more jobs than it has free slots,
so no job waits behind a busy thread for long.

A thread closes its own database connections when it ends (at the
worker's stop): what its handlers used is kept between jobs
(connection.py ``handler_connections``), and a Django connection object is
a reference cycle, so nothing else would close its server session before
the garbage collector came by -- one session per job thread, for as long
as the process outlives ``Worker.run()`` (a worker run in a thread, a test).
"""

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence

from django.db import connections

logger = logging.getLogger("soniq_django.worker")


class JobThreads:
    """Run every call handed over (a job, or the final write of one), on up to ``size`` threads."""

    def __init__(self, size: int, name: str = "soniq-job",
                 on_start: Callable[[], object] | None = None):
        self._size = size
        self._on_start = on_start  # once per thread, before its first item
        self._name = name
        self._items: "queue.SimpleQueue[Callable[[], object] | None]" = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._closed = False

    def submit(self, item: Callable[[], object]) -> None:
        """Hand ``item`` to the next free thread (starting one while there are fewer than size)."""
        self.submit_many([item])

    def submit_many(self, items: Sequence[Callable[[], object]]) -> None:
        """``submit`` each of ``items`` (a round's jobs), in order, in one hand-over."""
        if self._closed:
            raise RuntimeError("the job threads are shut down")
        put = self._items.put
        for item in items:
            put(item)
        threads = self._threads
        for _ in range(min(len(items), self._size - len(threads))):  # one per item, up to size
            thread = threading.Thread(target=self._serve, name=f"{self._name}_{len(threads)}",
                                      daemon=True)  # an abandoned handler keeps no process
            threads.append(thread)
            thread.start()

    def shutdown(self, *, wait: bool, timeout: float = 0.0) -> bool:
        """Stop every thread once it is idle; items not yet taken are dropped.

        With ``wait``, return once every thread ended (their running items too), or
        ``timeout`` seconds passed. Returns whether every thread ended.
        """
        self._closed = True
        try:
            while True:  # items no thread took: dropped, as the worker's leases lapse
                self._items.get_nowait()
        except queue.Empty:
            pass
        for _ in self._threads:
            self._items.put(None)
        if wait:
            deadline = time.monotonic() + timeout  # the bound: the caller's
            for thread in self._threads:
                thread.join(max(0.0, deadline - time.monotonic()))
        return not self.running

    @property
    def running(self) -> int:
        """Threads still running (an item, or waiting for one)."""
        return sum(thread.is_alive() for thread in self._threads)

    def _serve(self) -> None:
        try:
            if self._on_start is not None:
                try:
                    self._on_start()
                except Exception:  # the thread serves all the same
                    logger.exception("worker error while starting a job thread")
            while True:
                item = self._items.get()
                if item is None:
                    return
                try:
                    item()
                except BaseException:  # keep the thread: the worker's own code failed, not the job
                    logger.exception("worker error on a job thread")
        finally:
            connections.close_all()  # this thread's own: what its last jobs kept open

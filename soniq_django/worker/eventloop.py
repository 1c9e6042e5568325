"""The worker's one event loop: where its ``async def`` handlers run, all on one thread.

A thread per async job (and an ``asyncio.run`` per job, a new loop each
time) costs a thread switch per job and a loop built and closed per job.
Here the main loop hands a round's async jobs over in one call (one
wake-up of the loop's thread for all of them); each runs as a task; a
task that ends hands its outcome to ``on_done`` on the loop's thread.

A worker with one slot has one job thread: it runs the loop itself, one
coroutine at a time (``run()``), with no thread of the loop's own and no
hand-over between threads.

The loop (and its thread) is made with the first async job, so a worker
whose handlers are all sync has none. Handlers share the loop: one
that blocks (a sync call inside ``async def``) holds up the others, as
on any event loop.
"""

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from .execution import Outcome, aexecute
from .flight import InFlight
from .timeouts import TimeLimit


class EventLoop:
    """One asyncio loop on a thread of its own, started on first use.

    ``on_start(flight)`` and ``on_done(flight, outcome)`` are called on the
    loop's thread when a job handed over with ``start`` begins and when it
    has ended; they must not block. ``on_start`` returns the run's time
    limit (None: none): its task is cancelled at ``flight.started`` plus
    that limit, on the loop's own timer, and the loop's other tasks run on.

    A run that begins late (``late(flight)``: its claim may have lapsed
    meanwhile) is first given to ``admit(flight)`` on a thread of the
    loop's executor, where it may call the database: False, and the run
    does not start (``admit`` has settled it).
    """

    def __init__(self, on_start: Callable[[InFlight], TimeLimit | None],
                 on_done: Callable[[InFlight, Outcome], None],
                 *, late: Callable[[InFlight], bool] = lambda flight: False,
                 admit: Callable[[InFlight], bool] = lambda flight: True,
                 threaded: bool = True, name: str = "soniq-asyncio"):
        self._threaded = threaded
        self._on_start = on_start
        self._on_done = on_done
        self._late = late
        self._admit = admit
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # kept until done (the loop keeps weak refs)

    def start(self, flights: list[InFlight]) -> None:
        """Run each of ``flights`` (async handlers) as a task; one wake-up of the loop for all."""
        self._running().call_soon_threadsafe(self._start_all, flights)

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coroutine`` on the loop and wait for its result (raises what it raised).

        Unthreaded, on the calling thread (the one job thread of a one-slot worker).
        """
        if not self._threaded:
            with self._lock:
                if self._loop is None:
                    self._loop = asyncio.new_event_loop()
                loop = self._loop
            return loop.run_until_complete(coroutine)
        return asyncio.run_coroutine_threadsafe(coroutine, self._running()).result()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the loop (tasks still running are abandoned: the worker is aborting then).

        Waits up to ``timeout`` seconds for the loop's thread (a daemon thread) to end.
        """
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None:
            return
        if thread is None:  # unthreaded: the job thread ran it, and is done with it
            if not loop.is_running():
                loop.close()
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)  # the bound: the caller's
        if not thread.is_alive():
            loop.close()

    def _running(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name=self._name, daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def _start_all(self, flights: list[InFlight]) -> None:
        loop = asyncio.get_running_loop()
        for flight in flights:
            task = loop.create_task(self._run_one(flight))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run_one(self, flight: InFlight) -> None:
        if self._late(flight) and not await asyncio.to_thread(self._admit, flight):
            return
        limit = self._on_start(flight)
        outcome = await aexecute(flight.claimed, flight.context, limit, started=flight.started)
        self._on_done(flight, outcome)

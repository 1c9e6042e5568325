"""A worker's database connections: one for its own work, taken in turns, and its handlers' own.

Django gives every thread a connection of its own. A worker's own work --
claims, completions, failures, heartbeats, its row, housekeeping -- needs
no connection per thread: it is short calls, one at a time, so one
connection (``SharedConnection``) serves every thread of the worker in
turns. A *turn* is one call (never a retry loop: retries wait outside
it). A handler that uses the ORM does so on its job thread's own
connection, as any Django code does; a job thread keeps that connection
while its handlers use it, and closes it after a job that did not
(``handler_connections``), and closes what it kept when it ends with the
worker (threads.py).

Connections per worker process (docs/deployment.md#connections-per-worker):

    1                    the shared connection
  + k                    job threads whose last job used the database (0 <= k <= concurrency)
  + 1 on PostgreSQL      the LISTEN connection (worker/wakeup.py)
  + 1 --with-scheduler   the scheduler thread

A server that refuses a connection (``max_connections`` reached, a
restart) is waited for, with backoff and jitter (``connect_patiently``):
the worker says so once, and never exits for it.

A server that stops answering is not waited for without bound (decision
0031). On PostgreSQL every connection the worker opens -- the shared one,
the heartbeat's second one, the job threads', the listener's, the
scheduler thread's -- has TCP keepalives, ``tcp_user_timeout`` and
``connect_timeout`` chosen from ``LEASE_SECONDS`` (``tcp_options``), so a
peer that went silent (a network partition) is found dead within
``dead_peer_seconds()``, about half a lease; what the project's
``OPTIONS`` set itself wins. A server that still acknowledges but no
longer answers (a stopped backend, a proxy that stopped forwarding) is
not caught by keepalives: each turn on the shared connection is watched
(``Watchdog``), and a call still on the wire after ``turn_bound()`` has its
socket shut down, so that it raises; its outcome is unknown, and the
nonces recover it as after any lost connection.
"""

import logging
import math
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any, TypeVar, cast

from django.db import DatabaseError, connections

from ..conf import get_settings
from ..errors import translate

logger = logging.getLogger("soniq_django.worker")

T = TypeVar("T")

#: The first pause after a refused connection; it doubles up to MAX_RETRY_SECONDS.
FIRST_RETRY_SECONDS = 0.1
#: The longest pause between two connection attempts (each pause is jittered: half to all of it).
MAX_RETRY_SECONDS = 5.0
#: The least time a silent peer is given before the worker's connections count it dead; a
#: lease of L seconds gives it L / 2 when that is longer (``dead_peer_seconds``).
MIN_DEAD_PEER_SECONDS = 2.0
#: The least time a turn's call may stay on the wire before the watchdog ends it; a lease of
#: L seconds gives it L / 2 when that is longer (``turn_bound``).
MIN_TURN_SECONDS = 3.0
#: How often the watchdog looks at the call it watches (so it ends one at most this late).
WATCHDOG_TICK_SECONDS = 0.1
#: A watchdog with nothing to watch for this long ends its thread (the next turn starts one).
WATCHDOG_IDLE_SECONDS = 10.0
_TUNED = "_soniq_tcp_options"  # set on a connection wrapper whose settings carry tcp_options()


def dead_peer_seconds(lease: float | None = None) -> float:
    """How long a silent peer may stay silent before a worker connection counts it dead.

    Half a lease (``LEASE_SECONDS`` unless ``lease`` is given), at least
    MIN_DEAD_PEER_SECONDS: leases of other jobs are renewed on the heartbeat's
    second connection meanwhile, and the connection is reopened well before a
    lease that a partition did not cut would lapse.
    """
    if lease is None:
        lease = float(get_settings().LEASE_SECONDS)
    return max(lease / 2, MIN_DEAD_PEER_SECONDS)


def turn_bound(lease: float | None = None) -> float:
    """The longest a turn's call stays on the wire before the watchdog ends it.

    Half a lease, at least MIN_TURN_SECONDS. A call takes milliseconds; one
    that waits on a lock gives up at its lock timeout first (that timeout
    must stay below this bound, docs/internals.md#the-bound-of-every-wait).
    """
    if lease is None:
        lease = float(get_settings().LEASE_SECONDS)
    return max(lease / 2, MIN_TURN_SECONDS)


def tcp_options(lease: float | None = None) -> dict[str, int]:
    """libpq's options that find a silent peer dead within ``dead_peer_seconds(lease)``.

    Keepalive probes start after half that time without traffic and come
    every sixth of it (whole seconds, libpq's unit); ``tcp_user_timeout``
    ends the connection once data (a probe, or a call) has gone
    unacknowledged that long, and ``connect_timeout`` bounds each attempt at
    connecting (a partitioned server never answers one).
    """
    window = dead_peer_seconds(lease)
    idle = max(1, int(window / 2))
    interval = max(1, int(window / 6))
    return {
        "keepalives": 1,
        "keepalives_idle": idle,
        "keepalives_interval": interval,
        "keepalives_count": max(1, math.ceil((window - idle) / interval)),
        "tcp_user_timeout": int(window * 1000),  # milliseconds
        "connect_timeout": max(2, math.ceil(window)),  # libpq's least
    }


def tcp_defaults(wrapper: Any) -> dict[str, int]:
    """``tcp_options()`` for ``wrapper``'s database, less what its ``OPTIONS`` set.

    Empty unless PostgreSQL, and for a connection of Django's own pool
    (``OPTIONS["pool"]``), whose options the pool fixed for every thread.
    """
    if wrapper.vendor != "postgresql":
        return {}
    options = wrapper.settings_dict.get("OPTIONS") or {}
    if options.get("pool"):
        return {}
    return {key: value for key, value in tcp_options().items() if key not in options}


def tune(wrapper: Any) -> Any:
    """Give ``wrapper`` the worker's TCP options from its next connect on; returns it.

    Only this wrapper's settings change (a copy; ``settings.DATABASES`` is
    left alone); the project's own ``OPTIONS`` win. Does nothing twice.
    """
    if getattr(wrapper, _TUNED, False):
        return wrapper
    defaults = tcp_defaults(wrapper)
    if defaults:
        options = wrapper.settings_dict.get("OPTIONS") or {}
        wrapper.settings_dict = {**wrapper.settings_dict, "OPTIONS": {**defaults, **options}}
    setattr(wrapper, _TUNED, True)
    return wrapper


def own_connection(using: str) -> Any:
    """This thread's own connection wrapper for ``using``, tuned (``tune``); none is opened."""
    return tune(connections[using])


def on_own_connection(using: str, target: Callable[..., T]) -> Callable[..., T]:
    """``target``, run in a thread whose own connection to ``using`` is tuned first."""
    def run(*args: Any, **kwargs: Any) -> T:
        own_connection(using)
        return target(*args, **kwargs)

    return run


class Backoff:
    """Pauses between attempts: doubling from FIRST_RETRY_SECONDS to MAX_RETRY_SECONDS.

    Each pause is a random half to all of its length, so that workers that
    lost the database together do not come back together.
    """

    def __init__(self) -> None:
        self.delay = FIRST_RETRY_SECONDS

    def pause(self) -> float:
        """The next pause (jittered); the one after it is twice as long, up to the cap."""
        pause = random.uniform(self.delay / 2, self.delay)
        self.delay = min(self.delay * 2, MAX_RETRY_SECONDS)
        return pause

    def reset(self) -> None:
        self.delay = FIRST_RETRY_SECONDS


def connect_patiently(wrapper: Any, stop: threading.Event | None = None) -> None:
    """Open ``wrapper``'s connection; while the server refuses, wait and try again.

    The pauses double from FIRST_RETRY_SECONDS to MAX_RETRY_SECONDS, each
    a random half to all of its length, so workers refused together do
    not come back together. Logs once when it starts waiting and once when
    it got through. Returns once connected (at once if it was); raises
    SoniqError(QUEUE_PERSISTENCE_FAILED) after a refused attempt once
    ``stop`` is set. Errors other than database errors propagate.
    """
    backoff, waited_since = Backoff(), None
    while True:
        try:
            wrapper.ensure_connection()
        except DatabaseError as error:
            refusal = error
        else:
            if waited_since is not None:
                logger.info("connected to the database after waiting %.1f s",
                            time.monotonic() - waited_since)
            return
        if waited_since is None:
            waited_since = time.monotonic()
            logger.warning("cannot connect to the database (unavailable, or refusing "
                           "connections); waiting, and trying again with backoff")
        pause = backoff.pause()
        if stop is None:
            time.sleep(pause)
        elif stop.is_set() or stop.wait(pause):
            raise translate(refusal) from None


def wait_for_database(using: str) -> None:
    """Connect this thread to ``using``, waiting as long as it takes (see ``connect_patiently``).

    The connection has the worker's TCP options (``tune``): the worker takes
    it over as its shared one (``SharedConnection.adopt``).
    """
    connect_patiently(own_connection(using))


def keep_healthy(conn: Any) -> None:
    """Between uses: close ``conn`` if it is broken or too old, else keep it open.

    Django's ``close_old_connections()`` treats each use like a web
    request: with the default ``CONN_MAX_AGE=0`` it closes every
    connection, and the next fenced write pays for a new backend and a
    cold PL/pgSQL session (about 9 ms a job, measured in bench/; decision
    0001). A worker is one long "request": a healthy connection stays
    open, a positive ``CONN_MAX_AGE`` still recycles it, and one that
    failed is closed and reopened on next use.
    """
    if conn.connection is None:
        return
    max_age = conn.settings_dict["CONN_MAX_AGE"]
    if (
        conn.get_autocommit() != conn.settings_dict["AUTOCOMMIT"]
        or (conn.errors_occurred and not conn.is_usable())
        or (max_age and conn.close_at is not None and time.monotonic() >= conn.close_at)
    ):
        conn.close()
    else:
        conn.errors_occurred = False


class Watchdog:
    """Ends a call that stayed on the wire too long: shuts its socket down, so that it raises.

    A server that stalled (a stopped backend, a proxy that stopped
    forwarding) while its host still acknowledges is never noticed by TCP:
    keepalive probes are answered. ``watching(raw, bound)`` watches one call
    (a block) on the psycopg connection ``raw``; past ``bound`` seconds the
    watchdog's thread shuts the socket down (both ways) and the blocked call
    fails as on a lost connection. The thread looks every
    WATCHDOG_TICK_SECONDS, and ends after WATCHDOG_IDLE_SECONDS with nothing
    to watch (the next block starts it again).

    It watches a duplicate of the socket's descriptor, taken when the block
    starts and closed when it ends, under the lock the thread holds to shut
    it down: a descriptor number the call's connection closed and another
    connection reused is never the one shut down.
    """

    def __init__(self, name: str):
        self.name = name
        self.fired = 0
        """How many calls it ended."""
        self._lock = threading.Lock()
        self._watched: tuple[float, int, float] | None = None  # (deadline, descriptor, bound)
        self._running = False

    @contextmanager
    def watching(self, raw: Any, bound: float) -> Iterator[None]:
        """Watch the block's calls on ``raw`` (a psycopg connection); end one past ``bound`` s."""
        try:
            descriptor = os.dup(raw.fileno())
        except Exception:  # closed, or no socket: nothing on the wire to end
            yield
            return
        with self._lock:
            self._watched = (time.monotonic() + bound, descriptor, bound)
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name=f"soniq-watchdog-{self.name}",
                                 daemon=True).start()
        try:
            yield
        finally:
            with self._lock:
                self._watched = None
                os.close(descriptor)

    def _run(self) -> None:
        try:
            self._watch()
        except BaseException:  # the next block starts another thread
            with self._lock:
                self._running = False
            raise

    def _watch(self) -> None:
        idle_since = time.monotonic()
        tick = threading.Event()  # never set: a pause of WATCHDOG_TICK_SECONDS
        while True:
            tick.wait(WATCHDOG_TICK_SECONDS)
            now = time.monotonic()
            with self._lock:
                if self._watched is None:
                    if now - idle_since >= WATCHDOG_IDLE_SECONDS:
                        self._running = False  # under the lock: a new block starts a thread
                        return
                    continue
                idle_since = now
                deadline, descriptor, bound = self._watched
                if now < deadline:
                    continue
                self._watched = None  # once: the block ends on its own from here
                self.fired += 1
                _shut_down(descriptor)
            logger.warning("a database call on the %s connection got no answer within %g s "
                           "(a stalled server or network); it was ended, and the connection "
                           "is opened again", self.name, bound)


def _shut_down(descriptor: int) -> None:
    """Shut the socket behind ``descriptor`` down both ways (the descriptor stays open)."""
    try:
        sock = socket.socket(fileno=os.dup(descriptor))
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # not connected any more
        pass
    finally:
        sock.close()


class SharedConnection:
    """The worker's one connection to ``using`` for its own work, used by its threads in turns.

    ``stopping`` ends a wait for the server: once it is set, a refused
    connection raises instead of being waited for. On PostgreSQL every turn
    is watched (``Watchdog``): a call still on the wire after
    ``turn_bound()`` is ended.
    """

    def __init__(self, using: str, stopping: threading.Event):
        self.using = using
        self._stopping = stopping
        self._lock = threading.RLock()
        self._wrapper: Any = None
        self._depth = 0  # turns this thread holds, nested (only the outermost is watched)
        self.watchdog = Watchdog("worker's shared")
        self.connecting = False
        """A turn is opening the connection (the server may be refusing it)."""

    def adopt(self) -> None:
        """Make this thread's open connection to ``using`` the shared one, if it has one.

        ``soniq_worker`` connected (waiting if need be) and checked the
        migrations before the worker started: keeping that connection
        spares a reconnect, and a busy server cannot take the slot
        meanwhile. A connection inside a transaction is left alone.
        """
        own = {conn.alias: conn for conn in connections.all(initialized_only=True)}
        conn = own.get(self.using)
        with self._lock:
            if (self._wrapper is None and conn is not None and conn.connection is not None
                    and not conn.in_atomic_block):
                del connections[self.using]
                conn.inc_thread_sharing()
                if not getattr(conn, _TUNED, False) and tcp_defaults(conn):
                    conn.close()  # opened without the worker's TCP options: opened again with
                tune(conn)
                self._wrapper = conn

    @contextmanager
    def turn(self) -> Iterator[None]:
        """One turn: ``connections[using]`` is the shared connection, connected, in this thread.

        Waits for the other threads' turns, and for the server while it
        refuses (see ``connect_patiently``); raises
        SoniqError(QUEUE_PERSISTENCE_FAILED) when the worker is stopping
        and the server refused.
        """
        with self._lock:
            previous = self._install()
            try:
                with self._watched():
                    yield
            finally:
                self._uninstall(previous)

    @contextmanager
    def try_turn(self, patience: float) -> Iterator[bool]:
        """A turn if one comes within ``patience`` seconds (True); else False and no turn.

        Without a turn ``connections[using]`` stays this thread's own
        connection (with the worker's TCP options), which the caller closes
        when it is done with it.
        """
        if not self._lock.acquire(timeout=patience):
            own_connection(self.using)
            yield False
            return
        try:
            previous = self._install()
            try:
                with self._watched():
                    yield True
            finally:
                self._uninstall(previous)
        finally:
            self._lock.release()

    @contextmanager
    def _watched(self) -> Iterator[None]:
        """The outermost turn of this thread, watched on PostgreSQL (``turn_bound()``)."""
        self._depth += 1
        try:
            if self._depth > 1 or self._wrapper.vendor != "postgresql":
                yield
            else:
                with self.watchdog.watching(self._wrapper.connection, turn_bound()):
                    yield
        finally:
            self._depth -= 1

    def turns(self, target: T) -> T:
        """``target`` with every method call made in a turn of its own (a ``Turns``)."""
        return cast(T, Turns(target, self))

    def close(self) -> None:
        """Close the shared connection (a next turn would open it again)."""
        with self._lock:
            if self._wrapper is not None:
                self._wrapper.close()

    def _install(self) -> Any:
        """Make the shared connection this thread's ``connections[using]``; return what was."""
        wrapper = self._connected()
        previous = next((conn for conn in connections.all(initialized_only=True)
                         if conn.alias == self.using), None)
        connections[self.using] = wrapper
        return previous

    def _uninstall(self, previous: Any) -> None:
        keep_healthy(self._wrapper)
        if previous is None:
            del connections[self.using]
        else:
            connections[self.using] = previous

    def _connected(self) -> Any:
        if self._wrapper is None:
            self._wrapper = tune(connections.create_connection(self.using))
            self._wrapper.inc_thread_sharing()
        if self._wrapper.connection is None:
            self.connecting = True
            try:
                connect_patiently(self._wrapper, self._stopping)
            finally:
                self.connecting = False
        return self._wrapper


class Turns:
    """An object whose every method call takes one turn on a ``SharedConnection``.

    Methods are looked up at each call, so a method replaced on the
    object afterwards is the one called.
    """

    def __init__(self, target: Any, shared: SharedConnection):
        self._target = target
        self._shared = shared

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not callable(value):
            return value

        def in_a_turn(*args: Any, **kwargs: Any) -> Any:
            with self._shared.turn():
                return value(*args, **kwargs)

        return in_a_turn


@contextmanager
def handler_connections(using: str | None = None) -> Iterator[None]:
    """Around one handler's run on a job thread: then close what it did not use.

    A connection the thread had open and the handler did not use is
    closed; one it used (or opened) is kept while healthy, for the next
    job. So a job thread holds a connection only while its handlers use
    the database. Only connections open before the run are watched: a
    handler that touches no database costs nothing here. The thread's
    connection to ``using`` (the worker's database) has the worker's TCP
    options (``tune``).
    """
    if using is not None:
        own_connection(using)
    initialized = _initialized()
    if not initialized:  # the common case, kept cheap: no connection on this thread at all
        yield
        for conn in _initialized():  # the handler opened these: kept while healthy
            keep_healthy(conn)
        return
    opened = [conn for conn in initialized if conn.connection is not None]
    watched = {id(conn) for conn in opened}
    used: set[str] = set()
    if not opened:
        yield
    else:
        with ExitStack() as watching:
            for conn in opened:
                watching.enter_context(conn.execute_wrapper(_noting(used, conn.alias)))
            yield
    for conn in connections.all(initialized_only=True):
        if id(conn) in watched and conn.alias not in used:
            conn.close()
        else:
            keep_healthy(conn)


def _initialized() -> list[Any]:
    """This thread's connection wrappers (``connections.all(initialized_only=True)``)."""
    return list(connections.all(initialized_only=True))


def _noting(used: set[str], alias: str) -> Callable[..., Any]:
    def execute(run: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
                ) -> Any:
        used.add(alias)
        return run(sql, params, many, context)

    return execute


class CallersConnection:
    """The caller's own connection, used as it is: the ``SharedConnection`` of ``run_jobs()``.

    ``soniq_django.testing.run_jobs()`` runs jobs in the calling thread on
    the test's own connection (inside its transaction); there is no other
    thread to take turns with.
    """

    def __init__(self, using: str):
        self.using = using

    @contextmanager
    def turn(self) -> Iterator[None]:
        yield

    def turns(self, target: T) -> T:
        return target


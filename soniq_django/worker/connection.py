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
0031, wire.py). On PostgreSQL every connection the worker opens -- the
shared one, the heartbeat's second one, the job threads'
(``handler_connections``), the listener's, the scheduler thread's
(``on_own_connection``), ``soniq_worker``'s first (``wait_for_database``) --
has the TCP options of ``wire.tcp_options`` (``wire.tune``), so a peer that
went silent (a network partition) is found dead within about half a
lease. A server that still acknowledges but no longer answers is not
caught by them: each turn on the shared connection is watched
(``wire.Watchdog``), and a call still on the wire after ``turn_bound()``
has its socket shut down, so that it raises; its outcome is unknown, and
the nonces recover it as after any lost connection.
"""

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any, TypeVar, cast

from django.db import DatabaseError, connections
from django.db.backends.signals import connection_created

from .. import pooling
from ..bounds import lock_wait
from ..errors import translate
from ..owned._store import bound_session, session_bound
from ..wire import Watchdog, tcp_defaults, tune, tuned, turn_bound

logger = logging.getLogger("soniq_django.worker")

T = TypeVar("T")

#: The first pause after a refused connection; it doubles up to MAX_RETRY_SECONDS.
FIRST_RETRY_SECONDS = 0.1
#: The longest pause between two connection attempts (each pause is jittered: half to all of it).
MAX_RETRY_SECONDS = 5.0


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
                if not tuned(conn) and tcp_defaults(conn):
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
        self._bound(wrapper)
        previous = next((conn for conn in connections.all(initialized_only=True)
                         if conn.alias == self.using), None)
        connections[self.using] = wrapper
        return previous

    @staticmethod
    def _bound(wrapper: Any) -> None:
        """Bound the shared connection's session by ``lock_wait()`` (``bound_session``).

        Its calls then send no bounds of their own: the same bounds, at no
        cost per call. Only on PostgreSQL reached directly (not through a
        pooler, where the calls bound themselves, transaction by
        transaction), outside a transaction; a failure leaves the calls to
        bound themselves.
        """
        raw = wrapper.connection
        wanted = lock_wait()
        if (wrapper.vendor != "postgresql" or session_bound(raw) == wanted
                or wrapper.in_atomic_block):
            return
        try:
            if not raw.info.transaction_status and not pooling.pooled(raw):
                bound_session(raw, wanted)
        except Exception:  # the calls send their bounds themselves
            pass

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


#: What a job thread knows of its own connections between jobs (``handler_connections``).
_job_thread = threading.local()


def _count_connect(sender: Any, connection: Any, **kwargs: Any) -> None:
    """``connection_created``: count the connections this thread opened (``handler_connections``)."""
    _job_thread.connects = getattr(_job_thread, "connects", 0) + 1


connection_created.connect(_count_connect, weak=False, dispatch_uid="soniq_job_thread_connects")


@contextmanager
def handler_connections() -> Iterator[None]:
    """Around one handler's run on a job thread: then close what it did not use.

    A connection the thread had open and the handler did not use is
    closed; one it used (or opened) is kept while healthy, for the next
    job. So a job thread holds a connection only while its handlers use
    the database. Only connections open before the run are watched.

    A handler that touches no database costs next to nothing here: the
    thread remembers its connection wrappers from its last job, and Django's
    ``connection_created`` signal tells whether the run opened one; only
    then are this thread's wrappers looked up again (a lookup in Django's
    per-thread store costs microseconds, and this runs once a job). The
    worker's job threads give their connection to the worker's database
    its TCP options when they start (``own_connection``, threads.py).
    """
    known: list[Any] | None = getattr(_job_thread, "wrappers", None)
    if known is None:  # this thread's first job
        known = _job_thread.wrappers = _initialized()
    opened = [conn for conn in known if conn.connection is not None]
    if not opened:  # the common case, kept cheap: nothing open on this thread
        connects = getattr(_job_thread, "connects", 0)
        yield
        if getattr(_job_thread, "connects", 0) != connects:  # the handler opened some: kept
            known = _job_thread.wrappers = _initialized()
            for conn in known:
                keep_healthy(conn)
        return
    watched = {id(conn) for conn in opened}
    used: set[str] = set()
    with ExitStack() as watching:
        for conn in opened:
            watching.enter_context(conn.execute_wrapper(_noting(used, conn.alias)))
        yield
    known = _job_thread.wrappers = _initialized()
    for conn in known:
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


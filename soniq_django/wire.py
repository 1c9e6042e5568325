"""How long a worker's call may stay on the wire: TCP options from the lease, and a watchdog.

Two ways a connection dies without a word (decision 0031):

- **a silent peer** (a network partition: nothing comes back, not even
  acknowledgements). TCP alone notices after its retransmissions give up,
  minutes to hours later. Every PostgreSQL connection of a worker gets
  libpq's keepalive options, ``tcp_user_timeout`` and ``connect_timeout``
  from ``tcp_options()``, so a silent peer is dead after
  ``dead_peer_seconds()``, about half a lease. ``tune()`` puts them on a
  connection wrapper's own copy of its settings (``settings.DATABASES`` is
  never written); what the alias's ``OPTIONS`` set wins;
- **a stalled server** (a stopped backend, a proxy that stopped
  forwarding): its host still acknowledges, keepalives are answered, and
  only a deadline on the client's side helps. ``Watchdog`` shuts the socket
  of a call still on the wire after its bound down, so that the call
  raises; the shared connection watches every turn with ``turn_bound()``
  (connection.py), the listener its statements (wakeup.py).

docs/internals.md#the-bound-of-every-wait lists every bound. Below the worker (it
imports only conf): a wait_for_job's connection (waiting.py) takes the same TCP options.
"""

import logging
import math
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .conf import get_settings

logger = logging.getLogger("soniq_django.worker")

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


def tuned(wrapper: Any) -> bool:
    """Whether ``tune`` already gave ``wrapper`` the worker's TCP options."""
    return bool(getattr(wrapper, _TUNED, False))


def tune(wrapper: Any) -> Any:
    """Give ``wrapper`` the worker's TCP options from its next connect on; returns it.

    Only this wrapper's settings change (a copy; ``settings.DATABASES`` is
    left alone); the project's own ``OPTIONS`` win. Does nothing twice.
    """
    if tuned(wrapper):
        return wrapper
    defaults = tcp_defaults(wrapper)
    if defaults:
        options = wrapper.settings_dict.get("OPTIONS") or {}
        wrapper.settings_dict = {**wrapper.settings_dict, "OPTIONS": {**defaults, **options}}
    setattr(wrapper, _TUNED, True)
    return wrapper


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

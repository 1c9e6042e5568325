"""Wake an idle worker when a job arrives: LISTEN on PostgreSQL, polling elsewhere.

``soniq_enqueue`` and owned submissions send NOTIFY soniq_new_job with the
queue name at commit. The listener has its own connection, to
``SONIQ["LISTEN_DATABASE"]`` when set, else to the worker's database. A
LISTEN needs a session of its own: through a transaction pooler
(PgBouncer's ``pool_mode = transaction``) it lands on a server connection
the pooler then hands to other clients, and no notification reaches the
listener.

So the listener tests itself each time it connects. A connection proved
to go through a transaction pooler (listen.transaction_pooled: a server
session handed from one client to another) fails the test before any
LISTEN, so none is left on a pooled server session. Otherwise it also
LISTENs on a probe channel, sends a NOTIFY with a fresh token there over a new
connection to the worker's database (the way an enqueue's NOTIFY comes) and
waits up to ``PROBE_SECONDS`` for it.

- Heard: it wakes the worker on each notification for its queues until the
  connection is lost, then reconnects with backoff (jittered, as the
  worker's own connection does) and tests itself again. It warns once an
  outage and says when it listens again; the retries in between are DEBUG.
- Not heard: it warns, naming ``LISTEN_DATABASE``; takes its LISTENs off
  the server session that holds them, so that none stays behind on a
  pooled server connection (``_unlisten``); closes its connection; and
  from then on wakes the worker every ``FALLBACK_POLL_SECONDS`` (or
  ``POLL_INTERVAL``, if shorter).

The worker also polls every ``POLL_INTERVAL`` seconds, so a lost
notification only delays a job.

Stopping: the listener waits for notifications in slices of
``LISTEN_SLICE_SECONDS`` and looks at ``stop`` between them. A stopping
worker does not wait for the slice to run out: ``interrupt()`` sends a
NOTIFY on a channel only this listener hears (``soniq_listener_<token>``,
LISTENed with the others), and the listener returns as soon as it arrives.
A burst worker or one told to stop by SIGTERM thus exits without waiting on
its listener.

Bounds (docs/internals.md#the-bound-of-every-wait): a wait for
notifications lasts at most ``LISTEN_SLICE_SECONDS``; the listener's
connections have the worker's TCP options (wire.py: a silent server
is found dead within ``dead_peer_seconds()``, and each connect attempt gives
up after ``connect_timeout``); every statement it sends (its LISTENs, the
probe's NOTIFY, the UNLISTENs, the interrupt) is watched, and one still
unanswered after ``turn_bound()`` is ended (``Watchdog``), as a stalled
server would otherwise hold the listener -- or a stopping worker -- forever.
"""

import logging
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from django.db import connections

from .. import listen
from ..conf import get_settings
from ..listen import PROBE_CHANNEL, close as _close
from .connection import Backoff
from ..wire import Watchdog, tcp_defaults, turn_bound

if TYPE_CHECKING:
    from psycopg import Connection, Notify

logger = logging.getLogger("soniq_django.worker")

CHANNEL = "soniq_new_job"
#: How long the self-test waits for its own NOTIFY (it takes milliseconds when it works).
PROBE_SECONDS = listen.PROBE_SECONDS
#: How often a listener that hears nothing wakes the worker instead.
FALLBACK_POLL_SECONDS = 0.5
#: How long one wait for notifications lasts before ``stop`` is looked at again
#: (``interrupt()`` ends a wait at once).
LISTEN_SLICE_SECONDS = 0.5
#: The longest ``interrupt()`` waits to connect: a stopping worker whose server
#: does not answer gives up on it then (its listener stops within a slice).
INTERRUPT_CONNECT_SECONDS = 2


class Listener(threading.Thread):
    """Sets ``wake`` whenever a job is enqueued in one of ``queues`` (None: any).

    ``ready`` is set once the self-test passed; ``deaf`` once it failed (the
    listener then wakes the worker every ``FALLBACK_POLL_SECONDS``).
    """

    def __init__(self, using: str, queues: list[str] | None, wake: threading.Event,
                 stop: threading.Event):
        super().__init__(name="soniq-listener", daemon=True)
        self.using, self.queues, self.wake, self.stop = using, queues, wake, stop
        self.listen_alias = get_settings().LISTEN_DATABASE or using
        self.ready = threading.Event()
        self.deaf = threading.Event()
        # Heard by this listener alone: interrupt() ends its wait.
        self.stop_channel = f"soniq_listener_{uuid.uuid4().hex[:16]}"
        self.watchdog = Watchdog("listener's")

    def run(self) -> None:
        backoff, away_since = Backoff(), None
        while not self.stop.is_set():
            raw = None
            try:
                raw, session = self._connect()
                heard = session is not None and self._heard(raw)
                if self.stop.is_set():
                    return
                if not heard:
                    self._give_up(raw, session)
                    _close(raw)
                    raw = None
                    self._poll()
                    return
                backoff.reset()
                if away_since is None:
                    logger.info("listening for new jobs on database %r", self.listen_alias)
                else:
                    logger.info("listening for new jobs on database %r again, after %.1f s "
                                "without it", self.listen_alias, time.monotonic() - away_since)
                    away_since = None
                self.ready.set()
                self.wake.set()  # jobs may have arrived while we were not listening
                self._listen(raw)
            except Exception:  # the database is away; the worker keeps polling meanwhile
                # One warning an outage, not one a retry: the retries are at DEBUG.
                pause = backoff.pause()
                what = "cannot connect" if raw is None else "lost its connection"
                if away_since is None:
                    away_since = time.monotonic()
                    logger.warning("listener %s; the worker polls every %g s meanwhile, and "
                                   "the listener tries again with backoff", what,
                                   float(get_settings().POLL_INTERVAL))
                else:
                    logger.debug("listener %s; retrying in %.1f s", what, pause)
                self.stop.wait(pause)
            finally:
                _close(raw)

    # Connections ------------------------------------------------------

    def _new_connection(self, alias: str, connect_within: int | None = None
                        ) -> "Connection[Any]":
        """A new autocommit connection to ``alias``; ``connect_within`` caps connect_timeout.

        With the worker's TCP options (wire.py), under what the alias's
        ``OPTIONS`` set.
        """
        return new_connection(alias, connect_within)

    def _connect(self) -> "tuple[Connection[Any], int | None]":
        """A connection LISTENing on its three channels, and the server session that holds them.

        Session None: the connection goes through a transaction pooler
        (proved before any LISTEN), and it LISTENs on nothing.
        """
        raw = self._new_connection(self.listen_alias)
        try:
            if listen.transaction_pooled(raw, self.listen_alias,
                                         tcp_defaults(connections[self.listen_alias]),
                                         self._watch):
                return raw, None
            session = listen.listen(raw, (CHANNEL, PROBE_CHANNEL, self.stop_channel), self._watch)
        except Exception:
            _close(raw)
            raise
        return raw, session

    def _watch(self, raw: "Connection[Any]") -> Any:
        return self.watchdog.watching(raw, turn_bound())

    # The self-test ----------------------------------------------------

    def _heard(self, raw: "Connection[Any]") -> bool:
        """Whether a NOTIFY sent on the worker's database reaches ``raw`` within PROBE_SECONDS."""
        token = listen.new_token()
        sender = self._new_connection(self.using)
        try:
            with self._watch(sender):
                sender.execute("SELECT pg_notify(%s, %s)", [PROBE_CHANNEL, token])
        finally:
            _close(sender)
        heard = listen.heard(raw, token, PROBE_SECONDS, self.stop.is_set, self._note)
        if heard:
            with self._watch(raw):
                raw.execute(f"UNLISTEN {PROBE_CHANNEL}")
        return heard

    def _give_up(self, raw: "Connection[Any]", session: int | None) -> None:
        interval = min(FALLBACK_POLL_SECONDS, float(get_settings().POLL_INTERVAL))
        logger.warning(
            "the listener on database %r does not hear NOTIFY (%s): polling every %.1f s "
            "instead of listening. Set SONIQ['LISTEN_DATABASE'] to a direct or session-mode "
            "connection to the worker's database (docs/deployment.md).", self.listen_alias,
            "it goes through a transaction pooler" if session is None
            else "a transaction pooler in between?", interval)
        if session is None:  # it LISTENs on nothing
            self.deaf.set()
            return
        try:
            reached = self._unlisten(raw, session)
        except Exception:  # the connection went: so did its session, unless pooled
            reached = False
        if not reached:
            logger.info("the listener's LISTEN may stay on a pooled server connection until "
                        "the pooler closes it")
        self.deaf.set()

    def _unlisten(self, raw: "Connection[Any]", session: int) -> bool:
        """Take this listener's LISTENs off server session ``session``, if ``raw`` reaches it."""
        return listen.unlisten_session(raw, session, (CHANNEL, PROBE_CHANNEL, self.stop_channel),
                                       self._watch, self.stop.is_set)

    # Waking the worker ------------------------------------------------

    def _note(self, note: "Notify") -> None:
        if note.channel == CHANNEL and (self.queues is None or note.payload in self.queues):
            logger.debug("notified of a new job in queue %r", note.payload)
            self.wake.set()

    def _listen(self, raw: "Connection[Any]") -> None:
        while not self.stop.is_set():
            for note in raw.notifies(timeout=LISTEN_SLICE_SECONDS):
                if self.stop.is_set():
                    return  # interrupt() or a stop between two notifications
                self._note(note)

    def interrupt(self) -> None:
        """End a wait for notifications now, once ``stop`` is set; never raises.

        Sends a NOTIFY on this listener's own channel over a new connection
        to the worker's database, the way the self-test sends its probe. A
        listener that is not listening (not yet connected, deaf, waiting
        to reconnect) needs none: it waits on ``stop`` itself. A server that
        does not answer is given up on after ``INTERRUPT_CONNECT_SECONDS``,
        so that stopping never waits longer than that for it.
        """
        if not self.is_alive() or not self.ready.is_set() or self.deaf.is_set():
            return
        try:
            sender = self._new_connection(self.using, connect_within=INTERRUPT_CONNECT_SECONDS)
            try:
                # A stalled server: given up on after INTERRUPT_CONNECT_SECONDS here too.
                with self.watchdog.watching(sender, INTERRUPT_CONNECT_SECONDS):
                    sender.execute("SELECT pg_notify(%s, '')", [self.stop_channel])
            finally:
                _close(sender)
        except Exception:  # the database is away: the listener sees stop within a slice
            logger.debug("could not interrupt the listener; it stops within %g s",
                         LISTEN_SLICE_SECONDS)

    def _poll(self) -> None:
        """Wake the worker every FALLBACK_POLL_SECONDS (POLL_INTERVAL if shorter) until stopped."""
        interval = min(FALLBACK_POLL_SECONDS, float(get_settings().POLL_INTERVAL))
        while not self.stop.wait(interval):
            self.wake.set()


def new_connection(alias: str, connect_within: int | None = None) -> "Connection[Any]":
    """A new autocommit connection to ``alias`` with the worker's TCP options (wire.py)."""
    return listen.new_connection(alias, connect_within, tcp_defaults(connections[alias]))

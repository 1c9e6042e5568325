"""The worker's side of index_rebuild.py: look at the horizon, rebuild in a thread of its own.

``Rebuilds.look()`` runs in the heartbeat's housekeeping, at most once a
LOOK_SECONDS, as one turn on the shared connection (one catalog query,
``HorizonWatch.look``). When a pinned horizon has just been released it
starts a thread (``soniq-index-rebuild``) that runs ``rebuild_bloated`` on a
connection of its own and closes it: a REINDEX never holds the shared
connection, the heartbeat or a job thread, and the worker never waits for
it (a daemon thread; a rebuild cut off by the worker's exit leaves an invalid
copy that the next rebuild drops). PostgreSQL only; none at all when
``SONIQ["REBUILD_INDEXES_AFTER_PIN"]`` is False, behind a connection pooler,
or after the database refused the rebuild for want of privilege.
"""

import logging
import threading
import time

from django.db import connections

from .. import pooling
from ..conf import get_settings
from ..index_rebuild import MAX_PASSES, HorizonWatch, rebuild_bloated
from .connection import SharedConnection, own_connection

logger = logging.getLogger("soniq_django.worker")

#: How often a worker looks at the horizon (its housekeeping runs about once a minute).
LOOK_SECONDS = 60.0
#: SQLSTATE insufficient_privilege: the worker's role does not own soniq_jobs.
INSUFFICIENT_PRIVILEGE = "42501"


class Rebuilds:
    """One worker's looks at the horizon and the rebuild thread they start."""

    def __init__(self, shared: SharedConnection, using: str):
        self.shared = shared
        self.using = using
        self.watch = HorizonWatch()
        self.off = connections[using].vendor != "postgresql"
        self._next_look = 0.0
        self._thread: threading.Thread | None = None
        self._passes = 0  # rebuild runs since the last pin ended
        self._rebuilt: frozenset[str] = frozenset()  # what they rebuilt

    def look(self, patience: float) -> None:
        """Look at the horizon if it is time (a turn waited for at most ``patience`` s);
        start a rebuild when a pin has just ended. Raises what the turn's call raises."""
        now = time.monotonic()
        if (self.off or now < self._next_look or not get_settings().REBUILD_INDEXES_AFTER_PIN
                or (self._thread is not None and self._thread.is_alive())):
            return
        with self.shared.try_turn(patience) as turn:
            if not turn:
                return
            self._next_look = now + LOOK_SECONDS
            connection = connections[self.using]
            connection.ensure_connection()
            if pooling.pooled(connection.connection):
                self.off = True
                logger.info("index rebuilds after a pinned horizon are off: database %r is "
                            "reached through a connection pooler", self.using)
                return
            with connection.cursor() as cursor:
                due = self.watch.look(cursor)
        if due:
            self._thread = threading.Thread(target=self._rebuild, name="soniq-index-rebuild",
                                            daemon=True)
            self._thread.start()

    def _rebuild(self) -> None:
        """The rebuild thread: ``rebuild_bloated`` on this thread's own connection, closed after."""
        try:
            own_connection(self.using)
            result = rebuild_bloated(self.using, skip=self._rebuilt)
        except Exception:  # a connection that failed: the next look tries again
            logger.warning("could not rebuild the soniq_jobs indexes after a pinned horizon; "
                           "trying again at the next look", exc_info=True)
            return
        finally:
            connections[self.using].close()
        if result.busy:
            return  # another worker rebuilds: this one looks again later
        self._passes += 1
        self._rebuilt |= {name for name, _, _ in result.rebuilt}
        if not result.rebuilt or result.failed or self._passes >= MAX_PASSES:
            self.watch.done()
            self._passes, self._rebuilt = 0, frozenset()
        # else one more pass at the next look: vacuum may have given more of the heap back
        # since, which lowers the bar for the indexes this one left.
        for name, before, after in result.rebuilt:
            logger.info("rebuilt index %s after a pinned horizon: %.1f MB -> %.1f MB",
                        name, before / 2**20, after / 2**20)
        if result.dropped:
            logger.info("dropped %d invalid index(es) left by an interrupted rebuild",
                        len(result.dropped))
        if result.failed == INSUFFICIENT_PRIVILEGE:
            self.off = True
            logger.warning("index rebuilds after a pinned horizon are off: the database role "
                           "does not own soniq_jobs (SQLSTATE %s)", result.failed)
        elif result.failed:
            logger.warning("a rebuild of the soniq_jobs indexes stopped (SQLSTATE %s); the "
                           "next pinned horizon's end tries again", result.failed)

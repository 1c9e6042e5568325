"""Wake an idle worker when a job arrives: LISTEN on PostgreSQL, polling elsewhere.

``soniq_enqueue`` and owned submissions send NOTIFY soniq_new_job with the
queue name at commit. The listener has its own connection (a LISTEN needs a
session, not a pooled transaction) and reconnects with backoff; the worker
still polls every ``poll_interval`` seconds, so a lost notification only
delays a job.
"""

import logging
import threading

from django.db import connections

logger = logging.getLogger("soniq_django.worker")


class Listener(threading.Thread):
    """Sets ``wake`` whenever a job is enqueued in one of ``queues`` (None: any)."""

    def __init__(self, using: str, queues: list[str] | None, wake: threading.Event,
                 stop: threading.Event):
        super().__init__(name="soniq-listener", daemon=True)
        self.using, self.queues, self.wake, self.stop = using, queues, wake, stop
        self.ready = threading.Event()

    def _connect(self):
        wrapper = connections[self.using]
        raw = wrapper.get_new_connection(wrapper.get_connection_params())
        raw.autocommit = True
        raw.execute("LISTEN soniq_new_job")
        return raw

    def run(self) -> None:
        delay = 0.1
        while not self.stop.is_set():
            try:
                raw = self._connect()
            except Exception:  # the database is away; keep polling meanwhile
                logger.warning("listener cannot connect; retrying in %.1f s", delay)
                self.stop.wait(delay)
                delay = min(delay * 2, 5.0)
                continue
            delay = 0.1
            self.ready.set()
            self.wake.set()  # jobs may have arrived while we were not listening
            try:
                while not self.stop.is_set():
                    for note in raw.notifies(timeout=0.5):
                        if self.queues is None or note.payload in self.queues:
                            self.wake.set()
            except Exception:
                logger.warning("listener lost its connection; reconnecting")
            finally:
                try:
                    raw.close()
                except Exception:
                    pass

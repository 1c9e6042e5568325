"""How soon a worker looks again when a rate limit held its claim back.

A claim that found nothing makes the worker wait for news: a NOTIFY of a
new job, a job of its own finishing, or ``POLL_INTERVAL``. A queue held
back by its rate limit sends no news when its window moves on, so a worker
serving one polls every P/N seconds instead (``flow.rate_poll``: a rate of N
per P seconds, at least 50 ms, never longer than ``POLL_INTERVAL``); so does a
worker of a queue where a key with a rate offers a job (``keys.limits.key_rate_poll``:
its offered job falls due when the key's window moves on). What
the rate limits are is read from soniq_queue_settings at most every
``REFRESH_SECONDS``, on the worker's shared connection.
"""

import time

from .. import flow
from ..keys.limits import key_rate_poll
from ..errors import SoniqError, translating
from .connection import SharedConnection

#: How often a worker reads the rate limits of its queues again.
REFRESH_SECONDS = 10.0


class RatePoll:
    """``seconds(poll_interval)``: the wait after a claim that found nothing."""

    def __init__(self, using: str, queues: list[str] | None, shared: SharedConnection):
        self.using, self.queues, self.shared = using, queues, shared
        self._cap: float | None = None
        self._next = 0.0

    def seconds(self, poll_interval: float) -> float:
        now = time.monotonic()
        if now >= self._next:
            self._next = now + REFRESH_SECONDS
            try:
                with self.shared.turn(), translating(self.using):
                    caps = [cap for cap in (flow.rate_poll(self.using, self.queues),
                                            key_rate_poll(self.using, self.queues))
                            if cap is not None]
                    self._cap = max(flow.MIN_RATE_POLL, min(caps)) if caps else None
            except SoniqError:
                pass  # the database is away: keep the last reading; the claim will say so
        return poll_interval if self._cap is None else min(poll_interval, self._cap)

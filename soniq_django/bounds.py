"""How long a worker waits: the bounds of its calls and its heartbeat, in one place.

Below the worker and the steps (``steps/run.py``, whose atomic steps share an
atomic job's bounds and its recovery): it imports only ``conf`` and ``errors``.

Each is a fraction of ``LEASE_SECONDS`` (or of the beat, itself at most a
third of the lease), read when used, so ``override_settings`` works. Why
these fractions, and what they guarantee together: docs/internals.md
("The bound of every wait") and decision 0030.

- A live lease is renewed at least every ``2 * beat_interval()`` (at most
  two thirds of a lease): a beat sleeps one beat, waits at most
  ``patience()`` for its turn on the shared connection (else it goes on
  a connection of its own), and its renewal lasts at most
  ``renewal_wait()``. So a claim has at least a third of its lease left at
  any time.
- A call on the shared connection waits at most ``lock_wait()`` for any
  one lock, and runs each of its statements (at most two) at most twice
  that: a turn lasts at most ``longest_turn()``, a quarter of a lease --
  less than the third a renewed claim always has left, so a round that
  holds its completions' rows locked cannot outlast their leases.
- An atomic run whose COMMIT was lost leaves a backend idle in its
  transaction, holding the job's row: the server ends it after
  ``orphan_limit()``, a third of a lease.
"""

import threading
import time
from collections.abc import Callable
from typing import Any

from .conf import get_settings
from .errors import ErrorCode, SoniqError


def lease() -> float:
    """``LEASE_SECONDS``."""
    return float(get_settings().LEASE_SECONDS)


def beat_interval() -> float:
    """Seconds between heartbeats: HEARTBEAT_SECONDS, at most a third of the lease."""
    return max(0.05, min(float(get_settings().HEARTBEAT_SECONDS), lease() / 3))


def patience() -> float:
    """How long a beat waits for its turn on the shared connection: half a beat, once per beat."""
    return beat_interval() / 2


def renewal_wait() -> float:
    """How long a beat's renewal call may last: half a beat (at most what is left of the beat).

    Its statement is bounded by that (``statement_timeout``), and each row
    lock another transaction holds is waited for at most half of it
    (``lock_timeout``).
    """
    return beat_interval() / 2


def lock_wait() -> float:
    """How long a call on the shared connection waits for any one lock: a sixteenth of a lease.

    Each statement of the call is cancelled after twice that
    (``owned._store.bounds_sql``); either way its transaction rolls back
    and nothing is written: an answer, not an unknown outcome.
    """
    return lease() / 16


#: The most statements one call on the shared connection sends (a round:
#: soniq_complete_many, then soniq_claim_many).
MAX_STATEMENTS = 2


def longest_turn() -> float:
    """The longest a call on the shared connection lasts on the server: a quarter of a lease.

    Network time is not in it: a server that stops answering is the
    connections' own bound (keepalives, ``tcp_user_timeout``).
    """
    return MAX_STATEMENTS * 2 * lock_wait()


def orphan_limit() -> float:
    """How long an atomic run's backend may sit idle in its transaction after its completion
    (``idle_in_transaction_session_timeout``): a third of a lease."""
    return lease() / 3


def retrying(call: Callable[..., Any], deadline: float, stop: threading.Event) -> Any:
    """Call ``call()`` until it stops raising QUEUE_PERSISTENCE_FAILED or ``deadline`` passes.

    Returns its value, or None when the deadline passed (or ``stop`` was set) without an
    answer; any other error is raised. The pauses between tries (0.05 s, doubling, at most
    2 s) leave the connection to other threads: on the worker's shared connection each call
    takes its own turn (the heartbeat's lease renewals among them); the turn closes a broken
    connection, and the next try opens a new one.
    """
    delay = 0.05
    while True:
        try:
            return call()
        except SoniqError as error:
            if error.code is not ErrorCode.QUEUE_PERSISTENCE_FAILED:
                raise
        if time.monotonic() >= deadline or stop.wait(delay):
            return None
        delay = min(delay * 2, 2.0)

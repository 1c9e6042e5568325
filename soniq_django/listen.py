"""Connections that LISTEN, and the test that a NOTIFY reaches one.

Shared by the worker's listener (worker/wakeup.py) and ``wait_for_job``
(waiting.py); imports neither. A LISTEN needs a server session of its own:
through a transaction pooler (PgBouncer's ``pool_mode = transaction``) it
lands on a server connection the pooler then hands to other clients, and no
notification reaches the listener. So both follow one rule
(docs/deployment.md#listening-for-new-jobs): listen on
``SONIQ["LISTEN_DATABASE"]`` when set, else on the database itself; test
once, by sending a NOTIFY with a fresh token over a new connection to the
database (the way an enqueue's or a completion's NOTIFY comes), whether it
is heard (``heard``); when it is not, take the LISTENs off the server
session that holds them (``unlisten_session``) and poll instead.

Before any LISTEN, ``transaction_pooled`` looks for proof that the
connection is behind a transaction pooler. With that proof there is no
LISTEN at all, so none can be left behind on a pooled server session:
taking one off again means reaching that one session among the pool's,
which a busy pool may never hand back in time.

Every function takes ``watch``: a context manager factory that bounds a
statement on the wire (the worker passes its ``Watchdog``; the default
watches nothing, the TCP options of the connection bound it).
"""

import contextlib
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ContextManager, cast

from django.db import connections

from .pooling import pooled

if TYPE_CHECKING:
    from psycopg import Connection, Notify

#: The channel of the self-test; its payload is a fresh token, so listeners tell theirs apart.
PROBE_CHANNEL = "soniq_listener_probe"
#: How long the self-test waits for its own NOTIFY (it takes milliseconds when it works).
PROBE_SECONDS = 2.0
# Attempts at reaching the server session that holds a LISTEN no one hears.
# A pooler usually hands the session just released to the next transaction,
# but other clients of a busy pool take it in between: 10 tries missed it
# once in a loaded test run, and 50 (about a second) missed it once in a full
# suite's two lanes with the worker's own connections in the same pool; so the
# listener and a waiter try for about five seconds (only on a pooled connection,
# once per process, before polling).
UNLISTEN_TRIES = 250
UNLISTEN_PAUSE_SECONDS = 0.02
#: Attempts at catching a pooler handing a server session from one client to another.
HANDOVER_TRIES = 10

Watch = Callable[["Connection[Any]"], ContextManager[Any]]


def _unwatched(raw: "Connection[Any]") -> ContextManager[Any]:
    return contextlib.nullcontext()


def new_connection(alias: str, connect_within: int | None = None,
                   tcp: Mapping[str, int] | None = None) -> "Connection[Any]":
    """A new autocommit psycopg connection to ``alias``, outside Django's (a LISTEN's own).

    ``tcp``: libpq options (the worker's TCP options, wire.py) under
    what the alias's ``OPTIONS`` set; ``connect_within`` caps
    connect_timeout. Raises the driver's error when it cannot connect.
    """
    wrapper = connections[alias]
    params = {**(tcp or {}), **wrapper.get_connection_params()}
    if connect_within is not None:
        configured = int(params.get("connect_timeout") or 0)  # 0 or unset: no limit
        params["connect_timeout"] = (min(configured, connect_within) if configured > 0
                                     else connect_within)
    raw: Connection[Any] = wrapper.get_new_connection(params)
    raw.autocommit = True
    return raw


def close(raw: "Connection[Any] | None") -> None:
    """Close ``raw`` (None: nothing); never raises."""
    if raw is not None:
        try:
            raw.close()
        except Exception:
            pass


def listen(raw: "Connection[Any]", channels: Iterable[str], watch: Watch = _unwatched) -> int:
    """LISTEN on ``channels`` in one transaction; the server session that holds them.

    One transaction is one server session, even through a pooler: the
    session is what ``unlisten_session`` looks for.
    """
    with watch(raw), raw.transaction():
        for name in channels:
            raw.execute(f"LISTEN {name}")
        (session,) = cast("tuple[int]", raw.execute("SELECT pg_backend_pid()").fetchone())
    return session


def transaction_pooled(raw: "Connection[Any]", alias: str,
                       tcp: Mapping[str, int] | None = None, watch: Watch = _unwatched,
                       connect_within: int | None = None) -> bool:
    """Whether ``raw`` (autocommit, to ``alias``) is proved to be behind a transaction pooler.

    Straight to PostgreSQL: False after one query (pooling.pooled). Behind
    a pooler, session and transaction pooling look alike from one
    connection, so a second one, to the same alias, helps: a session pooler
    gives each client a server session for the client's whole life, a
    transaction pooler hands a session to whichever client's transaction
    comes next (PgBouncer hands out the one released last first). Proof is
    ``raw``'s own session changing between two of its transactions, or the
    other client's transaction landing on the session ``raw`` just used;
    HANDOVER_TRIES rounds without either count as a session pooler (the
    NOTIFY self-test then decides). Raises the driver's error when a query
    or the connect fails.
    """
    with watch(raw):
        if not pooled(raw):
            return False
        (ours,) = cast("tuple[int]", raw.execute("SELECT pg_backend_pid()").fetchone())
    other = new_connection(alias, connect_within, tcp)
    try:
        for _ in range(HANDOVER_TRIES):
            with watch(other):
                (theirs,) = cast("tuple[int]",
                                 other.execute("SELECT pg_backend_pid()").fetchone())
            with watch(raw):
                (now,) = cast("tuple[int]", raw.execute("SELECT pg_backend_pid()").fetchone())
            if theirs == ours or now != ours:
                return True
    finally:
        close(other)
    return False


def send_probe(alias: str, token: str, tcp: Mapping[str, int] | None = None,
               watch: Watch = _unwatched, connect_within: int | None = None) -> None:
    """NOTIFY ``PROBE_CHANNEL`` with ``token`` over a new connection to ``alias``."""
    sender = new_connection(alias, connect_within, tcp)
    try:
        with watch(sender):
            sender.execute("SELECT pg_notify(%s, %s)", [PROBE_CHANNEL, token])
    finally:
        close(sender)


def heard(raw: "Connection[Any]", token: str, seconds: float = PROBE_SECONDS,
          stop: Callable[[], bool] = lambda: False,
          other: Callable[["Notify"], None] = lambda note: None) -> bool:
    """Whether the probe ``token`` reaches ``raw`` (LISTENing on PROBE_CHANNEL) within ``seconds``.

    Other notifications that come meanwhile go to ``other``; ``stop()``
    true ends the wait early (not heard).
    """
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0 and not stop():
        for note in raw.notifies(timeout=left):
            if note.channel == PROBE_CHANNEL and note.payload == token:
                return True  # the generator holds the connection: leave it at once
            if stop():
                return False
            other(note)
    return False


def new_token() -> str:
    return uuid.uuid4().hex


def unlisten_session(raw: "Connection[Any]", session: int, channels: Iterable[str],
                     watch: Watch = _unwatched, stop: Callable[[], bool] = lambda: False
                     ) -> bool:
    """UNLISTEN ``channels`` on server session ``session``, if ``raw`` reaches it; whether it did.

    Behind a transaction pooler each transaction may get another server
    connection: try up to UNLISTEN_TRIES, and UNLISTEN only on the one that
    holds them -- by name: other clients' LISTENs may share it.
    """
    names = list(channels)
    for _ in range(UNLISTEN_TRIES):
        with watch(raw), raw.transaction():
            (here,) = cast("tuple[int]", raw.execute("SELECT pg_backend_pid()").fetchone())
            if here == session:
                for name in names:
                    raw.execute(f"UNLISTEN {name}")
                return True
        if stop():
            return False
        time.sleep(UNLISTEN_PAUSE_SECONDS)
    return False

"""Wait for a job to finish: ``wait_for_job`` and its async twin ``await_job``.

A job is finished once it is ``done``, ``cancelled`` or ``dead_letter``;
the wait returns its ``JobInfo`` (result or error, progress), or raises
``WaitTimeout`` (code WAIT_TIMEOUT) when ``timeout`` seconds pass first.

PostgreSQL: woken by NOTIFY within milliseconds of the commit that finished
the job. The waiter opens a connection of its own (to
``SONIQ["LISTEN_DATABASE"]`` when set, as a worker's listener does), and in
one transaction LISTENs on the job's channel (``soniq_job_<32 hex
digits>``), puts its row in ``soniq_job_waiters`` and takes a share lock on
the job's row -- which waits for a completion under way to commit, so that
no completion can miss the row and finish unseen. Then it reads the job. The
triggers of sql/job_progress_v1.sql NOTIFY the channel when the job
finishes, only while a waiter's row names it: a job nobody waits for costs
one index probe of an empty table at its end, and no NOTIFY. Whoever
finishes the job -- a soniq_django worker, an operator, a worker in another
language -- the trigger sees it.

A lost notification never makes a wait outlast its timeout: the waiter
reads the job again every ``RECHECK_SECONDS`` while it listens, and every
``POLL_SECONDS`` once its connection is lost (or could not be made).

Behind a transaction pooler NOTIFY does not reach a LISTEN, so a wait
follows the worker's rule (listen.py, docs/deployment.md): it listens on
``SONIQ["LISTEN_DATABASE"]`` when set, and the first wait of a process that
listens on an alias tests it: it sends a NOTIFY with a fresh token over a
new connection to the wait's database and waits up to ``PROBE_SECONDS``
(capped by its timeout) for it. Heard: this process's waits on that pair of
aliases listen from then on. Not heard: one warning naming
``LISTEN_DATABASE``, the probe's LISTEN taken off the server session that
holds it, and the waits poll every ``POLL_SECONDS``; the verdict is tested
again after ``DEAF_RETEST_SECONDS``. A connection proved to go through a
transaction pooler (listen.transaction_pooled) gets that verdict without
the test: no LISTEN is ever taken on a pooled server session. The test's
statements are watched (wire.py's ``Watchdog``): one unanswered
after the test's time is ended. SQLite: read every ``POLL_SECONDS``
(from 20 ms, doubling).

The job is read with ``get_job`` on the wait's alias (``using``, else the
routers' write alias: where jobs are written, and finished), so what a wait
returns is what ``get_job(id, using=alias)`` says then.
"""

import logging
import math
import threading
import time
import uuid
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.db import connections

from . import listen
from .conf import get_settings
from .errors import ConfigValidationError, WaitTimeout
from .producer.api import JobInfo, get_coerced, refuse_event_loop, write_alias
from .producer.request import coerce_job_id
from .wire import Watchdog, tcp_defaults

if TYPE_CHECKING:
    from psycopg import Connection

logger = logging.getLogger("soniq_django")

#: While listening, the job is read again this often all the same (a lost NOTIFY).
RECHECK_SECONDS = 2.0
#: How often a wait that cannot listen reads the job (SQLite: at most this often).
POLL_SECONDS = 0.5
#: SQLite's first pause: the pauses double from here up to POLL_SECONDS.
FIRST_POLL_SECONDS = 0.02
#: The longest timeout accepted (30 days).
MAX_TIMEOUT = 30 * 86400.0
#: A waiter's row outlives its timeout by this much before housekeeping deletes it.
WAITER_MARGIN_SECONDS = 60
#: The longest the share lock on the job's row is waited for (a completion under way).
LOCK_WAIT_SECONDS = 5

#: The longest the first wait of a process (per pair of aliases) waits for its probe NOTIFY.
PROBE_SECONDS = listen.PROBE_SECONDS
#: A "not heard" verdict is tested again after this long (a pooler may have been fixed).
DEAF_RETEST_SECONDS = 600.0

CHANNEL_PREFIX = "soniq_job_"

# Why a self-test's verdict is "not heard", as its warning says.
POOLED = "it goes through a transaction pooler"
UNHEARD = "a transaction pooler in between?"

# (listen alias, wait alias) -> (heard, when tested, why not heard); tested under _probing.
_verdicts: dict[tuple[str, str], tuple[bool, float, str]] = {}
_probing = threading.Lock()
_warned_deaf: set[tuple[str, str]] = set()
# Watches the self-test's statements; made by the first test (used under _probing).
_watchdog: Watchdog | None = None


def channel(job_id: uuid.UUID) -> str:
    """The NOTIFY channel of one job: ``soniq_job_`` and its 32 hex digits."""
    return CHANNEL_PREFIX + job_id.hex


def wait_for_job(job_id: uuid.UUID | str, *, timeout: float, using: str | None = None
                 ) -> JobInfo:
    """Wait until the job is ``done``, ``cancelled`` or ``dead_letter``; return its ``JobInfo``.

    ``timeout``: seconds (0: look once). Past it, ``WaitTimeout`` (a
    ``SoniqError`` with code ``WAIT_TIMEOUT``) whose ``job`` is the job as
    last read (None when no job has the id). ``ConfigValidationError`` for a
    ``job_id`` that is not a UUID or a bad ``timeout``; ``SoniqError``
    (QUEUE_PERSISTENCE_FAILED) when the database fails to answer a read;
    while an event loop runs in this thread, ``SoniqError(ASYNC_CONTEXT)``
    (await ``await_job`` there).
    """
    refuse_event_loop("wait_for_job", "await_job")
    return wait_checked(coerce_job_id(job_id), checked_timeout(timeout), write_alias(using))


def await_job(job_id: uuid.UUID | str, *, timeout: float, using: str | None = None
              ) -> Awaitable[JobInfo]:
    """Async twin of ``wait_for_job``: await it for the ``JobInfo``.

    Bad input raises at the call. The wait runs on a thread of its own (not
    Django's one thread for synchronous code), so other awaits go on
    meanwhile.
    """
    args = (coerce_job_id(job_id), checked_timeout(timeout), write_alias(using))
    return sync_to_async(_wait_closing, thread_sensitive=False)(*args)


def checked_timeout(timeout: Any) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise ConfigValidationError("timeout must be a number of seconds")
    seconds = float(timeout)
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_TIMEOUT:
        raise ConfigValidationError("timeout must be from 0 to 30 days, in seconds")
    return seconds


def _wait_closing(job_id: uuid.UUID, seconds: float, alias: str) -> JobInfo:
    """``wait_checked`` on a thread of an executor: its Django connection closed after."""
    try:
        return wait_checked(job_id, seconds, alias)
    finally:
        connections[alias].close()


def wait_checked(job_id: uuid.UUID, seconds: float, alias: str) -> JobInfo:
    """``wait_for_job`` of checked input."""
    deadline = time.monotonic() + seconds
    info = get_coerced(job_id, alias)
    if info is not None and info.finished:
        return info
    if seconds > 0 and connections[alias].vendor == "postgresql":
        return _listen(job_id, alias, deadline)
    return _poll(job_id, alias, deadline, info, FIRST_POLL_SECONDS)


def _timed_out(info: JobInfo | None) -> WaitTimeout:
    if info is None:
        return WaitTimeout("the job was not found (unknown, not committed yet, or purged) "
                           "before the timeout", None)
    return WaitTimeout(f"the job had not finished by the timeout (status {info.status})", info)


def _poll(job_id: uuid.UUID, alias: str, deadline: float, info: JobInfo | None,
          pause: float) -> JobInfo:
    """Read the job every ``pause`` seconds (doubling up to POLL_SECONDS) until it finished."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _timed_out(info)
        time.sleep(min(pause, left))
        pause = min(pause * 2, POLL_SECONDS)
        info = get_coerced(job_id, alias)
        if info is not None and info.finished:
            return info


def _listen(job_id: uuid.UUID, alias: str, deadline: float) -> JobInfo:
    listen_alias = get_settings().LISTEN_DATABASE or alias
    waiter = uuid.uuid4()
    raw: "Connection[Any] | None" = None
    try:
        try:
            raw = _new_connection(listen_alias, deadline)
            if _hears(raw, listen_alias, alias, deadline):
                _register(raw, job_id, waiter, deadline)
            else:
                listen.close(raw)
                raw = None
        except Exception:
            logger.debug("wait_for_job: cannot listen on database %r; polling every %g s",
                         listen_alias, POLL_SECONDS)
            listen.close(raw)
            raw = None
        while True:
            info = get_coerced(job_id, alias)  # after the LISTEN: no finish goes unseen
            if info is not None and info.finished:
                return info
            left = deadline - time.monotonic()
            if left <= 0:
                raise _timed_out(info)
            if raw is None:
                time.sleep(min(POLL_SECONDS, left))
                continue
            try:
                for _ in raw.notifies(timeout=min(RECHECK_SECONDS, left)):
                    break  # the job's channel: it finished (or a stale notice): read it
            except Exception:  # the connection is lost: poll until the deadline
                logger.debug("wait_for_job: the listening connection was lost; polling")
                listen.close(raw)
                raw = None
    finally:
        if raw is not None:
            _forget(raw, job_id, waiter)
            listen.close(raw)


def _new_connection(alias: str, deadline: float) -> "Connection[Any]":
    """A connection of the wait's own, connecting within the wait's deadline.

    With the worker's TCP options (a silent server is found dead, wire.py).
    """
    return listen.new_connection(alias, max(1, math.ceil(deadline - time.monotonic())),
                                 _tcp(alias))


def _hears(raw: "Connection[Any]", listen_alias: str, alias: str, deadline: float) -> bool:
    """Whether a NOTIFY sent on ``alias`` reaches a LISTEN on ``listen_alias``: tested once.

    The first wait of the process on the pair tests it on ``raw`` (listen.py);
    later ones take the verdict (a "not heard" one until DEAF_RETEST_SECONDS
    passed), or poll when the test under way outlasts their deadline. A test
    cut short by the wait's deadline leaves no verdict.
    """
    pair = (listen_alias, alias)
    if not _probing.acquire(timeout=max(0.0, deadline - time.monotonic())):
        return False
    try:
        known = _verdicts.get(pair)
        if known is None or (not known[0]
                             and time.monotonic() - known[1] >= DEAF_RETEST_SECONDS):
            known = _probe(raw, listen_alias, alias,
                           min(PROBE_SECONDS, deadline - time.monotonic()))
            if known is None:
                return False
            _verdicts[pair] = known
    finally:
        _probing.release()
    if not known[0]:
        _warn_deaf(pair, known[2])
    return known[0]


def _probe(raw: "Connection[Any]", listen_alias: str, alias: str, seconds: float
           ) -> tuple[bool, float, str] | None:
    """The verdict of a self-test on ``raw`` (heard, when, why not); None when cut short unheard."""
    watch, within = _watch(seconds), max(1, math.ceil(seconds))
    if listen.transaction_pooled(raw, listen_alias, _tcp(listen_alias), watch, within):
        return False, time.monotonic(), POOLED  # nothing to hear there: no LISTEN taken
    session = listen.listen(raw, [listen.PROBE_CHANNEL], watch)
    token = listen.new_token()
    listen.send_probe(alias, token, _tcp(alias), watch, connect_within=within)
    heard = listen.heard(raw, token, seconds)
    if heard:
        with watch(raw):
            raw.execute(f"UNLISTEN {listen.PROBE_CHANNEL}")
    else:  # through a pooler: off the server session that holds it, not another one
        listen.unlisten_session(raw, session, [listen.PROBE_CHANNEL], watch)
    if not heard and seconds < PROBE_SECONDS:
        return None
    return heard, time.monotonic(), "" if heard else UNHEARD


def _watch(seconds: float) -> listen.Watch:
    """Watch the self-test's statements: one unanswered after ``seconds`` (at least 1) is ended."""
    global _watchdog
    if _watchdog is None:
        _watchdog = Watchdog("waiter's")
    watchdog, bound = _watchdog, max(1.0, seconds)
    return lambda raw: watchdog.watching(raw, bound)


def _tcp(alias: str) -> dict[str, int]:
    return tcp_defaults(connections[alias])


def _register(raw: "Connection[Any]", job_id: uuid.UUID, waiter: uuid.UUID,
              deadline: float) -> None:
    """LISTEN, the waiter's row, and a share lock on the job's row, in one transaction.

    The lock waits for a completion of the job under way to commit: one that
    began before the waiter's row was there (and so sent no NOTIFY) has
    committed by the time the job is read.
    """
    keep = max(0.0, deadline - time.monotonic()) + WAITER_MARGIN_SECONDS
    with raw.transaction():
        raw.execute(f"SET LOCAL lock_timeout = '{LOCK_WAIT_SECONDS}s'")
        raw.execute(f"LISTEN {channel(job_id)}")
        raw.execute(
            "INSERT INTO soniq_job_waiters (job_id, waiter, expires_at) "
            "VALUES (%s, %s, pg_catalog.now() + pg_catalog.make_interval(secs => %s))",
            [job_id, waiter, keep])
        raw.execute("SELECT 1 FROM soniq_jobs WHERE id = %s FOR SHARE", [job_id])


def _forget(raw: "Connection[Any]", job_id: uuid.UUID, waiter: uuid.UUID) -> None:
    try:
        raw.execute("DELETE FROM soniq_job_waiters WHERE job_id = %s AND waiter = %s",
                    [job_id, waiter])
    except Exception:  # housekeeping deletes it once it expired
        pass


def _warn_deaf(pair: tuple[str, str], why: str) -> None:
    if pair not in _warned_deaf:
        _warned_deaf.add(pair)
        logger.warning(
            "wait_for_job: a LISTEN on database %r does not hear NOTIFY sent on database %r "
            "(%s): polling every %g s instead. Set SONIQ['LISTEN_DATABASE'] to a direct or "
            "session-mode connection to the same database (docs/deployment.md).",
            pair[0], pair[1], why, POLL_SECONDS)

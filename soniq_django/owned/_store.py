"""Where owned operations touch the database: one class per backend.

``PostgresClaims`` calls the claim-protocol SQL functions
(``sql/claim_protocol_v1.sql`` and its later versions; ``sql/current.sql``
shows them as they stand), one round trip each. ``SqliteClaims`` does
the same inside one write transaction: it takes SQLite's write lock before
reading, so the row cannot change between the check and the write, and it
samples the time after the lock. Both raise ``SoniqError`` subclasses only
(``errors.translate`` maps database errors): a lost connection or an
unacknowledged commit becomes ``QUEUE_PERSISTENCE_FAILED``, a refusal
``QUEUE_DATABASE_REFUSED`` -- never ``False``.
"""

import datetime as dt
import json
import logging
import random
import uuid
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import Error as DatabaseError
from django.db import IntegrityError, connections, transaction
from django.db.models import F as models_F
from django.db.models import Count, Max, Q
from django.db.models.expressions import RawSQL
from django.utils import timezone

from ..conf import DEFAULT_MAX_ATTEMPTS
from ..errors import ConfigValidationError, ErrorCode, SoniqError, sqlstate, translate
from ..models import (
    FLOW_CONTROLLED, DeadLetterJob, Job, JobStatus, QueueHold, QueueSetting, QueueStart,
    TaskRegistration, Worker,
)
from .types import INT64_MAX, QueueClaimFence

CLAIM_COLUMNS = (
    "job_id", "job_name", "args", "queue", "priority", "attempts", "max_attempts",
    "lease_expires_at", "generation", "owner", "token",
)

#: How long a retry finished as superseded is kept by a failure report
#: (soniq_fail has no result-TTL parameter; 300 s is the default RESULT_TTL).
FAIL_SUPERSEDED_TTL = 300.0
LAPSED_ERROR = "lease lapsed: the worker stopped heartbeating"
#: The reason of the QUEUE_PERSISTENCE_FAILED a call made with ``lock_wait``
#: raises when another transaction's lock outlasted it, or its statement
#: outlasted twice that (SQLSTATE 55P03 or 57014): the call's transaction
#: rolled back and nothing was written -- an answer, not an unknown outcome.
LOCK_NOT_AVAILABLE = "lock_not_available"
#: What a call made with ``lock_wait`` answers when it hit its bound.
_BOUND_REACHED = frozenset({"55P03", "57014"})

logger = logging.getLogger("soniq_django.owned")


def retry_backoff(attempt: int, base: float, cap: float) -> float:
    """Seconds a failed ``attempt`` waits before it is due again: soniq_fail's rule.

    ``min(cap, base * 2^(attempt - 1))`` times a jitter factor from 0.5 to 1.
    The SQLite twin uses it, and so does the worker, which passes the delay
    it chose to ``fail_owned`` so that its log line can say it.
    """
    doubled: float = base * 2 ** min(max(attempt - 1, 0), 60)
    return min(cap, doubled) * (0.5 + 0.5 * random.random())


def persistence_failed(reason: str = "unavailable") -> SoniqError:
    return SoniqError(ErrorCode.QUEUE_PERSISTENCE_FAILED, reason)


def claim_conflict(reason: str) -> SoniqError:
    return SoniqError(ErrorCode.QUEUE_CLAIM_CONFLICT, reason)


@contextmanager
def guarded(alias: str, *, atomic: bool) -> Iterator[Any]:
    """Run owned database work; any database failure becomes a package error.

    With ``atomic`` the work is one transaction (a savepoint inside an
    enclosing one); the commit is inside the guard, so an unacknowledged
    commit raises QUEUE_PERSISTENCE_FAILED too.
    """
    connection = connections[alias]
    try:
        if atomic or connection.in_atomic_block:
            with transaction.atomic(using=alias):
                yield connection
        else:
            yield connection
    except DatabaseError as error:
        if _sqlite_busy(error):  # the write lock stayed taken: nothing was written
            raise persistence_failed(LOCK_NOT_AVAILABLE) from None
        raise translate(error, alias) from None


def _sqlite_busy(error: DatabaseError) -> bool:
    """Whether ``error`` is SQLite's "database is locked": the busy timeout (``OPTIONS["timeout"]``)
    passed while another connection held the write lock. Raised when the lock is taken, or at
    a COMMIT that could not get it (the transaction is then rolled back): nothing was written."""
    name = getattr(error.__cause__, "sqlite_errorname", None) or ""
    return name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED"))


def _json_text(value: Any) -> str | None:
    if value is None:  # most results: spare building an encoder
        return "null"
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def array_text(values: list[Any]) -> str:
    """A PostgreSQL array literal of ``values`` (str or int), for a ``%s::text[]`` parameter.

    One string parameter costs psycopg one quote, where a list costs it a
    dumper per element: the batched calls pass their arrays this way. Every
    element is double-quoted, with backslash and double quote escaped, so any
    text goes through unchanged (text holds no NUL in PostgreSQL).
    """
    try:
        body = '","'.join(values)  # all text (the common case), each element quoted
    except TypeError:  # not all text: numbers (generations), or a mix
        try:
            return "{" + ",".join(map(int.__repr__, values)) + "}"
        except TypeError:
            return _array_text(values)
    # No backslash, and no double quote but the separators': nothing to escape.
    if "\\" in body or body.count('"') != 2 * len(values) - 2:
        return _array_text(values)
    return '{"' + body + '"}'


def _array_text(values: list[Any]) -> str:
    """``array_text`` element by element: any text, numbers, or a mix."""
    return "{" + ",".join(
        '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(value, str) else str(int(value)) for value in values) + "}"


class PostgresClaims:
    """The owned operations as calls to the PostgreSQL claim-protocol functions.

    ``lock_wait`` (seconds, on the calls that take it): the call waits at
    most that long for any one lock, and each of its statements runs at most
    twice that (``bounds_sql``). Past it the call raises
    QUEUE_PERSISTENCE_FAILED with the reason ``LOCK_NOT_AVAILABLE``: its
    transaction rolled back, nothing was written. None: as long as it takes.
    """

    def __init__(self, alias: str):
        self.alias = alias

    def _rows(self, sql: str, params: list[Any], lock_wait: float | None = None
              ) -> list[tuple[Any, ...]]:
        with guarded(self.alias, atomic=False) as connection, connection.cursor() as cursor:
            with _bounded_by(lock_wait):
                _execute(connection, cursor, [sql], params, lock_wait)
            rows: list[tuple[Any, ...]] = cursor.fetchall()
            return rows

    def _claim_row(self, sql: str, params: list[Any], lock_wait: float | None = None
                   ) -> dict[str, Any] | None:
        rows = self._rows(sql, params, lock_wait)
        return self._claim_dict(rows[0]) if rows else None

    @staticmethod
    def _claim_dict(values: tuple[Any, ...]) -> dict[str, Any]:
        row = dict(zip(CLAIM_COLUMNS, values))
        if isinstance(row["args"], str):  # Django's psycopg setup leaves jsonb as text
            row["args"] = json.loads(row["args"])
        return row

    @staticmethod
    def _fence(f: QueueClaimFence) -> list[Any]:
        return [f.job_id, f.worker_id, f.generation, f.claim_token, f.queue]

    def claim(self, owner: str, token: str, queues: list[str] | None, lease: float,
              ttl: float, pid: int | None = None) -> dict[str, Any] | None:
        return self._claim_row(
            "SELECT * FROM soniq_claim(%s, %s, %s::text[], %s, %s, %s)",
            [owner, token, queues, lease, ttl, pid],
        )

    def claim_many(self, owner: str, tokens: list[str], queues: list[str] | None,
                   lease: float, ttl: float, pid: int | None = None,
                   lock_wait: float | None = None) -> list[dict[str, Any]]:
        rows = self._rows(
            "SELECT * FROM soniq_claim_many(%s, %s::text[], %s::text[], %s, %s, %s)",
            [owner, array_text(tokens), queues, lease, ttl, pid], lock_wait,
        )
        return [self._claim_dict(row) for row in rows]

    def recover(self, owner: str, token: str, lock_wait: float | None = None
                ) -> dict[str, Any] | None:
        return self._claim_row("SELECT * FROM soniq_recover_claim(%s, %s)", [owner, token],
                               lock_wait)

    def _boolean(self, function: str, f: QueueClaimFence, extra: list[Any],
                 lock_wait: float | None = None) -> bool:
        placeholders = ", ".join(["%s"] * (5 + len(extra)))
        rows = self._rows(f"SELECT {function}({placeholders})", self._fence(f) + extra,
                          lock_wait)
        return rows[0][0] is True

    def heartbeat(self, f: QueueClaimFence, lease: float, lock_wait: float | None = None) -> bool:
        """soniq_heartbeat; with ``lock_wait``, waiting at most that long for a lock.

        soniq_heartbeat locks the job's row. Another transaction holding it
        (an operator's ``SELECT ... FOR UPDATE``, a migration's lock on the
        table) would hold the renewal, and whoever waits for it, as long as
        it lasts. Inside the caller's transaction ``lock_wait`` is not
        applied: its settings are the caller's.
        """
        return self._boolean("soniq_heartbeat", f, [lease], lock_wait)

    def heartbeat_many(self, fences: list[QueueClaimFence], lease: float,
                       lock_wait: float | None = None
                       ) -> list[tuple[bool, int | None] | None]:
        """Renew every lease and read each claim's state, in one statement.

        For each fence, in order: None when its claim is gone (not
        renewed), else ``(cancel_requested, pid)``. The rows are locked in
        id order, as ``soniq_complete_many`` locks them, so a renewal and a
        batch completion sharing rows cannot deadlock. One locked row makes
        the whole call wait (and, past ``lock_wait``, fail): the caller
        renews the others one by one then.
        """
        order = sorted(range(len(fences)), key=lambda i: fences[i].job_id)
        ordered = [fences[i] for i in order]
        rows = self._rows(
            "SELECT f.i, soniq_heartbeat(f.id, f.owner, f.generation, f.token, f.queue, %s), "
            "s.cancel_requested, s.pid "
            "FROM ROWS FROM (pg_catalog.unnest(%s::text[]), pg_catalog.unnest(%s::text[]), "
            "pg_catalog.unnest(%s::bigint[]), pg_catalog.unnest(%s::text[]), "
            "pg_catalog.unnest(%s::text[])) WITH ORDINALITY AS f(id, owner, generation, token, "
            "queue, i) LEFT JOIN LATERAL soniq_get_state(f.id, f.owner, f.generation, f.token, "
            "f.queue) AS s ON true",
            [lease, array_text([f.job_id for f in ordered]),
             array_text([f.worker_id for f in ordered]),
             array_text([f.generation for f in ordered]),
             array_text([f.claim_token for f in ordered]),
             array_text([f.queue for f in ordered])], lock_wait)
        states: list[tuple[bool, int | None] | None] = [None] * len(fences)
        for i, renewed, cancel_requested, pid in rows:
            if renewed is True and cancel_requested is not None:
                states[order[i - 1]] = (cancel_requested, pid)
        return states

    def complete(self, f: QueueClaimFence, result: Any, ttl: float,
                 lock_wait: float | None = None) -> bool:
        rows = self._rows(
            "SELECT soniq_complete(%s, %s, %s, %s, %s, %s::jsonb, %s)",
            self._fence(f) + [_json_text(result), ttl], lock_wait,
        )
        return rows[0][0] is True

    def complete_last(self, f: QueueClaimFence, result: Any, ttl: float, lock_wait: float,
                      idle_limit: float) -> bool:
        """soniq_complete as the last statement of the caller's open transaction (an atomic run).

        Sent in one query string with the transaction's last settings: the
        completion waits at most ``lock_wait`` for the job's row (longer, it
        raises QUEUE_PERSISTENCE_FAILED, ``LOCK_NOT_AVAILABLE``, and the
        caller rolls back), and from now on the backend may sit idle in
        the transaction at most ``idle_limit`` seconds
        (``idle_in_transaction_session_timeout``): only the COMMIT is left,
        a moment later. If the COMMIT never arrives (a connection lost in a
        partition), the server ends that backend then, and with it the
        transaction and its lock on the row; the handler's own time before
        the completion is not limited. Transaction-local, so it holds
        behind a transaction pooler too.
        """
        lock_ms, idle_ms = max(1, round(lock_wait * 1000)), max(1, round(idle_limit * 1000))
        connection = connections[self.alias]
        # No savepoint of its own: a failure here ends the run's whole transaction anyway,
        # and the COMMIT is then the next thing the server hears of it.
        try:
            with connection.cursor() as cursor, _bounded_by(lock_wait):
                _execute(connection, cursor, [
                    f"SELECT pg_catalog.set_config('lock_timeout', '{lock_ms}ms', true), "
                    f"pg_catalog.set_config('idle_in_transaction_session_timeout', "
                    f"'{idle_ms}ms', true)",
                    "SELECT soniq_complete(%s, %s, %s, %s, %s, %s::jsonb, %s)"],
                    self._fence(f) + [_json_text(result), ttl], None)
                cursor.nextset()
                return bool(cursor.fetchone()[0] is True)
        except DatabaseError as error:
            raise translate(error, self.alias) from None

    def complete_and_claim(self, completions: list[tuple[QueueClaimFence, Any]], ttl: float,
                           owner: str, tokens: list[str], queues: list[str] | None,
                           lease: float, pid: int | None, lock_wait: float | None = None
                           ) -> tuple[list[bool], list[dict[str, Any]]]:
        """Complete ``completions`` (all of ``owner``) and claim one job per token, in one go.

        Two statements in one query string run as one implicit transaction
        (PostgreSQL's simple query protocol): one round trip, one commit, and
        a failure of either leaves neither. With Django's
        ``OPTIONS["server_side_binding"]`` the string is bound on the client
        all the same (``_execute``), so it stays one round trip.
        """
        statements: list[str] = []
        params: list[Any] = []
        if completions:
            fences = [f for f, _ in completions]
            statements.append("SELECT soniq_complete_many(%s::text[], %s, %s::bigint[], "
                              "%s::text[], %s::text[], %s::jsonb[], %s)")
            params += [array_text([f.job_id for f in fences]), owner,
                       array_text([f.generation for f in fences]),
                       array_text([f.claim_token for f in fences]),
                       array_text([f.queue for f in fences]),
                       array_text([_json_text(result) for _, result in completions]), ttl]
        if tokens:
            statements.append(
                "SELECT * FROM soniq_claim_many(%s, %s::text[], %s::text[], %s, %s, %s)")
            params += [owner, array_text(tokens), queues, lease, ttl, pid]
        with guarded(self.alias, atomic=False) as connection, connection.cursor() as cursor:
            with _bounded_by(lock_wait):
                _execute(connection, cursor, statements, params, lock_wait)
                completed = ([value is True for value in cursor.fetchone()[0]]
                             if completions else [])
                if completions and tokens and not cursor.nextset():
                    raise persistence_failed()  # the claim's answer never came
                claimed = [self._claim_dict(row) for row in cursor.fetchall()] if tokens else []
            return completed, claimed

    def fail(self, f: QueueClaimFence, error: str, retry: bool, delay: float | None,
             reason: str, dlq_record_id: str | None, default_max_attempts: int,
             base: float, cap: float, lock_wait: float | None = None) -> bool:
        return self._boolean(
            "soniq_fail", f,
            [error, retry, delay, reason, dlq_record_id, default_max_attempts, base, cap],
            lock_wait,
        )

    def defer(self, f: QueueClaimFence, error: str, delay: float, ttl: float,
              lock_wait: float | None = None) -> bool:
        return self._boolean("soniq_defer", f, [error, delay, ttl], lock_wait)

    def fail_and_hold(self, f: QueueClaimFence, lease: float, error: str, retry: bool,
                      delay: float | None, reason: str, dlq_record_id: str | None,
                      default_max_attempts: int, base: float, cap: float,
                      lock_wait: float | None = None) -> bool:
        """soniq_hold_slot, then soniq_fail, in one transaction; soniq_fail's answer.

        Two statements in one query string: one implicit transaction, one
        round trip (as ``complete_and_claim``), bounded by ``lock_wait``
        (``_execute``).
        """
        fail = [error, retry, delay, reason, dlq_record_id, default_max_attempts, base, cap]
        hold_sql = "SELECT soniq_hold_slot(%s, %s, %s, %s, %s, %s)"
        fail_sql = "SELECT soniq_fail(" + ", ".join(["%s"] * 13) + ")"
        with guarded(self.alias, atomic=False) as connection, connection.cursor() as cursor:
            with _bounded_by(lock_wait):
                _execute(connection, cursor, [hold_sql, fail_sql],
                         self._fence(f) + [lease] + self._fence(f) + fail, lock_wait)
            if not cursor.nextset():
                raise persistence_failed()  # the failure's answer never came
            return bool(cursor.fetchone()[0] is True)

    def release_hold(self, f: QueueClaimFence) -> bool:
        rows = self._rows("SELECT soniq_release_hold(%s, %s, %s)",
                          [f.job_id, f.worker_id, f.generation])
        return rows[0][0] is True

    def renew_holds(self, owner: str, fences: list[QueueClaimFence], lease: float) -> int:
        rows = self._rows("SELECT soniq_renew_holds(%s, %s::text[], %s::bigint[], %s)",
                          [owner, array_text([f.job_id for f in fences]),
                           array_text([f.generation for f in fences]), lease])
        return int(rows[0][0])

    def set_pid(self, f: QueueClaimFence, pid: int) -> bool:
        return self._boolean("soniq_set_pid", f, [pid])

    def set_progress(self, f: QueueClaimFence, done: int, total: int | None,
                     note: str | None, lock_wait: float | None = None) -> bool:
        """soniq_set_progress: the job's progress, under the claim's full fence."""
        return self._boolean("soniq_set_progress", f, [done, total, note], lock_wait)

    def get_state(self, f: QueueClaimFence, lock_wait: float | None = None
                  ) -> tuple[bool, int | None] | None:
        rows = self._rows("SELECT * FROM soniq_get_state(%s, %s, %s, %s, %s)", self._fence(f),
                          lock_wait)
        return rows[0] if rows else None

    def acknowledge_cancel(self, f: QueueClaimFence, ttl: float,
                           lock_wait: float | None = None) -> bool:
        return self._boolean("soniq_acknowledge_cancel", f, [ttl], lock_wait)

    def request_cancel(self, job_id: uuid.UUID, ttl: float) -> bool:
        rows = self._rows("SELECT soniq_request_cancel(%s, %s)", [job_id, ttl])
        return rows[0][0] is True


def _binds_on_server(connection: Any) -> bool:
    """Whether Django sends this connection's queries with server-side binding."""
    return bool(connection.settings_dict.get("OPTIONS", {}).get("server_side_binding"))


#: The ``lock_wait`` each psycopg connection's session is bounded by (``bound_session``).
_session_bounds: "weakref.WeakKeyDictionary[Any, float]" = weakref.WeakKeyDictionary()


def bound_session(raw: Any, lock_wait: float) -> None:
    """Bound every later statement of the psycopg connection ``raw``'s session by ``lock_wait``.

    ``bounds_sql``'s two settings, made once at session level, so that the
    calls bounded by the same ``lock_wait`` need not send them each time (a
    statement, about 25 us a call). Only for a connection of the worker's
    own that reaches its server directly, outside a transaction: behind a
    transaction pooler a session setting would leak to other clients.
    """
    ms = max(1, round(lock_wait * 1000))
    raw.execute(f"SET lock_timeout = '{ms}ms'")
    raw.execute(f"SET statement_timeout = '{2 * ms}ms'")
    _session_bounds[raw] = lock_wait


def session_bound(raw: Any) -> float | None:
    """The ``lock_wait`` ``raw``'s session is bounded by (``bound_session``), or None."""
    return _session_bounds.get(raw)


def bounds_sql(lock_wait: float) -> str:
    """The statement that bounds the rest of its transaction's waits: ``lock_wait`` for any one
    lock (``lock_timeout``), twice that for any one statement (``statement_timeout``).

    Both settings are transaction-local (``set_config(..., true)``), so they
    end with the call's transaction and nothing leaks to the session -- or,
    behind a transaction pooler, to another client's. Sent first in the
    call's own query string: no round trip of its own.
    """
    ms = max(1, round(lock_wait * 1000))
    return (f"SELECT pg_catalog.set_config('lock_timeout', '{ms}ms', true), "
            f"pg_catalog.set_config('statement_timeout', '{2 * ms}ms', true)")


def _execute(connection: Any, cursor: Any, statements: list[str], params: list[Any],
             lock_wait: float | None) -> None:
    """Send ``statements`` in one query string, bounded by ``lock_wait`` (``bounds_sql``).

    Several statements in one string run as one implicit transaction
    (PostgreSQL's simple query protocol), so the bounds set first hold for
    the statements after them, and a failure of any leaves none of them
    written. The cursor is left on the first statement's result. Inside
    the caller's transaction the bounds are not set: its settings are the
    caller's. A connection that binds on the server
    (``OPTIONS["server_side_binding"]``) sends one statement per message:
    the string is bound here, by psycopg's client-side binding (what
    Django does by default), and sent as one simple query all the same.
    """
    bounded = (lock_wait is not None and not connection.in_atomic_block
               and _session_bounds.get(connection.connection) != lock_wait)
    if bounded:
        statements = [bounds_sql(lock_wait)] + statements  # type: ignore[arg-type]
    sql = "; ".join(statements)
    if len(statements) > 1 and _binds_on_server(connection):
        from psycopg import ClientCursor

        sql = ClientCursor(connection.connection).mogrify(sql, params)
        cursor.execute(sql)
    else:
        cursor.execute(sql, params)
    if bounded:
        cursor.nextset()  # past the bounds' own result


@contextmanager
def _bounded_by(lock_wait: float | None) -> Iterator[None]:
    """Raise QUEUE_PERSISTENCE_FAILED(``LOCK_NOT_AVAILABLE``) when a bound of ``lock_wait``
    was reached (SQLSTATE 55P03, 57014): the call's transaction rolled back."""
    try:
        yield
    except DatabaseError as error:
        if lock_wait is not None and sqlstate(error) in _BOUND_REACHED:
            raise persistence_failed(LOCK_NOT_AVAILABLE) from None
        raise


@contextmanager
def fenced_writes(connection: Any) -> Iterator[None]:
    """Let the writes inside through the PostgreSQL protection trigger.

    Owned submissions and live owned claims are skipped by the trigger
    unless the transaction-local ``soniq.fenced_write`` gate is open; only
    soniq_django's services open it, around their own checked writes. The
    block is one transaction (a savepoint inside an enclosing one): in
    autocommit mode a transaction-local setting would end with its own
    statement.
    """
    with transaction.atomic(using=connection.alias):
        if connection.vendor != "postgresql":
            yield
            return
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('soniq.fenced_write', 'on', true)")
        try:
            yield
        finally:
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('soniq.fenced_write', 'off', true)")


def take_sqlite_write_lock(connection: Any) -> None:
    """Make the current SQLite transaction a write transaction now.

    A no-op UPDATE takes the RESERVED lock (waiting for the busy timeout if
    another writer holds it), so what this transaction reads next cannot be
    changed by anyone else before it writes.
    """
    with connection.cursor() as cursor:
        cursor.execute("UPDATE soniq_jobs SET status = status WHERE 0")


class SqliteClaims:
    """The owned operations in Python, each inside one SQLite write transaction.

    ``lock_wait`` is accepted and not needed: SQLite has no row locks, and
    every write waits for its one write lock at most the busy timeout
    (``OPTIONS["timeout"]``, 5 s unless set), then raises
    QUEUE_PERSISTENCE_FAILED with the reason ``LOCK_NOT_AVAILABLE``: nothing
    was written.
    """

    def __init__(self, alias: str):
        self.alias = alias

    @contextmanager
    def _locked(self) -> Iterator[dt.datetime]:
        with guarded(self.alias, atomic=True) as connection:
            take_sqlite_write_lock(connection)
            yield timezone.now()  # sampled after the lock

    def _jobs(self) -> Any:
        return Job.objects.using(self.alias)

    def _reap_lapsed(self, now: dt.datetime, ttl: float, batch: int = 10) -> None:
        """Settle lapsed claims as soniq_reap_lapsed_v1 does: each row on its own."""
        lapsed = self._jobs().filter(status=JobStatus.PROCESSING, lease_expires_at__lte=now)
        for row in lapsed.order_by("lease_expires_at")[:batch]:
            try:
                with transaction.atomic(using=self.alias):
                    self._settle_lapsed(row, now, ttl)
            except DatabaseError as error:
                # Undone by its savepoint; the claim goes on.
                logger.warning("lapsed job %s could not be settled (%s); left for later",
                               row.id, type(error).__name__)

    def _settle_lapsed(self, row: Job, now: dt.datetime, ttl: float) -> None:
        if row.cancel_requested:
            self._jobs().filter(id=row.id).update(
                status=JobStatus.CANCELLED, lease_expires_at=None, pid=None,
                expires_at=now + dt.timedelta(seconds=ttl), updated_at=now,
            )
        elif row.attempts >= (row.max_attempts if row.max_attempts is not None
                              else default_max_attempts(self.alias, row.job_name)):
            self._move_to_dead_letter(
                row.id, "lease lapsed with no attempts left", "max_retries_exceeded", None, now
            )
        else:
            self._requeue(row, LAPSED_ERROR, None, now, ttl)

    def _requeue(self, row: Job, error: str, scheduled_at: dt.datetime | None,
                 now: dt.datetime, ttl: float) -> str:
        """Queue a locked processing row again, or finish it as superseded by a queued twin.

        The twin of soniq_requeue_v1 (sql/claim_protocol_v3.sql): returns
        ``"queued"`` or ``"superseded"``.
        """
        values = {"scheduled_at": scheduled_at} if scheduled_at is not None else {}
        try:
            with transaction.atomic(using=self.alias):
                self._jobs().filter(id=row.id).update(
                    status=JobStatus.QUEUED, last_error=error, lease_expires_at=None, pid=None,
                    updated_at=now, **values,
                )
            return "queued"
        except IntegrityError:
            twin = self._queued_twin(row)
            if twin is None:
                raise
        key = "dedup_key" if twin.dedup_key is not None and twin.dedup_key == row.dedup_key \
            else "unique key"
        self._jobs().filter(id=row.id).update(
            status=JobStatus.CANCELLED, last_error=superseded_error(twin.id, key, error),
            lease_expires_at=None, pid=None, expires_at=now + dt.timedelta(seconds=ttl),
            updated_at=now,
        )
        return "superseded"

    def _queued_twin(self, row: Job) -> Job | None:
        """The queued job holding ``row``'s dedup key or unique key, if any."""
        keys = Q(pk__in=[])
        if row.dedup_key is not None:
            keys |= Q(dedup_key=row.dedup_key)
        if row.args_hash is not None:
            keys |= Q(job_name=row.job_name, args_hash=row.args_hash)
        twin: Job | None = self._jobs().filter(
            keys, status=JobStatus.QUEUED).exclude(id=row.id).first()
        return twin

    def _move_to_dead_letter(self, job_id: uuid.UUID, error: str | None, reason: str,
                             dlq_record_id: str | None, now: dt.datetime) -> None:
        row = self._jobs().get(id=job_id)
        dead = DeadLetterJob.objects.using(self.alias).filter(id=job_id).first()
        values = dict(
            job_name=row.job_name, args=row.args, queue=row.queue, priority=row.priority,
            max_attempts=row.max_attempts, attempts=row.attempts,
            last_error=row.last_error if error is None else error,
            dead_letter_reason=reason, original_created_at=row.created_at,
            moved_to_dead_letter_at=now, fence_required=row.fence_required,
            submission_id=row.submission_id, submission_fingerprint=row.submission_fingerprint,
        )
        tags = {"dlq_record_id": dlq_record_id} if dlq_record_id is not None else None
        if dead is None:
            DeadLetterJob.objects.using(self.alias).create(
                id=job_id, resurrection_count=0, tags=tags, **values
            )
        else:
            del values["original_created_at"]  # the first failure's row keeps its own
            values["fence_required"] = dead.fence_required or row.fence_required
            if dead.submission_id is not None:  # a protected identity is never replaced
                values.update(submission_id=dead.submission_id,
                              submission_fingerprint=dead.submission_fingerprint)
            DeadLetterJob.objects.using(self.alias).filter(id=job_id).update(
                tags=tags if tags is not None else dead.tags, **values
            )
        self._jobs().filter(id=job_id).delete()

    @staticmethod
    def _claimed(row: Job) -> dict[str, Any]:
        return {
            "job_id": row.id, "job_name": row.job_name, "args": row.args, "queue": row.queue,
            "priority": row.priority, "attempts": row.attempts,
            "max_attempts": row.max_attempts, "lease_expires_at": row.lease_expires_at,
            "generation": row.claim_generation, "owner": row.claim_owner,
            "token": row.claim_token,
        }

    def claim(self, owner: str, token: str, queues: list[str] | None, lease: float,
              ttl: float, pid: int | None = None) -> dict[str, Any] | None:
        rows = self.claim_many(owner, [token], queues, lease, ttl, pid)
        return rows[0] if rows else None

    def claim_many(self, owner: str, tokens: list[str], queues: list[str] | None,
                   lease: float, ttl: float, pid: int | None = None,
                   lock_wait: float | None = None) -> list[dict[str, Any]]:
        with self._locked() as now:
            if len(set(tokens)) != len(tokens) or self._jobs().filter(
                claim_token__in=tokens
            ).exists():
                raise claim_conflict("nonce_reused")
            self._reap_lapsed(now, ttl)
            found, rated = self._eligible(now, queues, len(tokens))
            if any(generation >= INT64_MAX for _, generation in found):
                raise claim_conflict("generation_exhausted")
            worker_uuid = _registered_worker(self.alias, owner) if found else None
            claimed: list[dict[str, Any]] = []
            for (job_id, generation), token in zip(found, tokens):
                self._jobs().filter(id=job_id).update(
                    status=JobStatus.PROCESSING, attempts=models_F("attempts") + 1,
                    claim_generation=generation + 1, claim_owner=owner, claim_token=token,
                    worker_id=worker_uuid, lease_expires_at=now + dt.timedelta(seconds=lease),
                    cancel_requested=False, pid=pid, updated_at=now, claimed_at=now,
                )
                row = self._jobs().get(id=job_id)
                if (row.claim_owner, row.claim_token, row.claim_generation) != (
                    owner, token, generation + 1
                ):
                    raise claim_conflict("claim_identity_changed")
                claimed.append(self._claimed(row))
            if rated:  # the rate limits' window: one row per start
                QueueStart.objects.using(self.alias).bulk_create([
                    QueueStart(queue=job["queue"], started_at=now)
                    for job in claimed if job["queue"] in rated])
            return claimed

    def _eligible(self, now: dt.datetime, queues: list[str] | None,
                  wanted: int) -> tuple[list[tuple[uuid.UUID, int]], set[str]]:
        """The jobs a claim may start, in claim order, and the rate-limited queues among them.

        The twin of claim protocol v8's soniq_claim_many (sql/claim_protocol_v8.sql):
        paused queues are skipped, each limited queue with a due job gives at
        most its budget (``_budget``), and the first ``wanted`` by (priority,
        created_at) are taken. Every scan reads one index in its order with a
        limit, so that a claim reads no row it could not take: a claim of
        every queue with nothing held back scans the unscheduled jobs of all
        queues (soniq_jobs_claim_now_idx), and the due scheduled ones only
        while one is due; otherwise each queue served is scanned on its own
        (soniq_jobs_claim_queue_now_idx, or soniq_jobs_claim_idx while a
        scheduled job is due), so that the backlog of a queue held back or
        not served is never read. The caller holds the write lock, so no
        other claim can change the counts before this one writes.
        """
        queued = self._jobs().filter(status=JobStatus.QUEUED)
        controlled = QueueSetting.objects.using(self.alias).filter(FLOW_CONTROLLED)
        if queues is not None:
            controlled = controlled.filter(queue__in=queues)
        settings = list(controlled.order_by("queue"))
        first_due = queued.filter(scheduled_at__isnull=False).order_by(
            "scheduled_at").values_list("scheduled_at", flat=True).first()
        due = Q(scheduled_at__isnull=True)
        if first_due is not None and first_due <= now:
            due |= Q(scheduled_at__lte=now)
        if queues is None and not settings:
            scans = [(queued.filter(scheduled_at__isnull=True), wanted)]
            if first_due is not None and first_due <= now:
                scans.append((queued.filter(scheduled_at__lte=now), wanted))
            return self._first(scans, wanted), set()
        held = {setting.queue for setting in settings}
        served = (dict.fromkeys(queues) if queues is not None
                  else self._queues_with_jobs(queued))
        scans = [(queued.filter(due, queue=queue), wanted)
                 for queue in served if queue not in held]
        rated = set()
        for setting in settings:
            if setting.paused or not queued.filter(due, queue=setting.queue).exists():
                continue
            budget = self._budget(setting, now, wanted)
            if setting.effective_rate is not None:
                rated.add(setting.queue)
            if budget > 0:
                scans.append((queued.filter(due, queue=setting.queue), budget))
        return self._first(scans, wanted), rated

    def _queues_with_jobs(self, queued: Any) -> list[str]:
        """The queues with a queued job, one index lookup each (soniq_jobs_claim_idx)."""
        names: list[str] = []
        while True:
            after = queued.filter(queue__gt=names[-1]) if names else queued
            name = after.order_by("queue").values_list("queue", flat=True).first()
            if name is None:
                return names
            names.append(name)

    @staticmethod
    def _first(scans: list[tuple[Any, int]], wanted: int) -> list[tuple[uuid.UUID, int]]:
        """The first ``wanted`` of the scans' jobs in claim order, each scan up to its limit.

        Ties in (priority, created_at) go by rowid, the order one scan of an
        index of every queue gives them.
        """
        found: list[tuple[Any, ...]] = []
        for scan, most in scans:
            found += scan.order_by("priority", "created_at").annotate(
                place=RawSQL('"soniq_jobs".rowid', ())).values_list(
                "id", "claim_generation", "priority", "created_at", "place")[:most]
        found.sort(key=lambda row: row[2:])
        return [(row[0], row[1]) for row in found[:wanted]]

    def _budget(self, setting: QueueSetting, now: dt.datetime, wanted: int) -> int:
        """How many of the queue's jobs may start now: the twin of soniq_queue_budget_v2.

        SQLite has no row locks: the write lock the caller holds stands for
        the settings row's, so a queue is never held back by a lock here.
        Running jobs are the queue's processing rows plus its live holds
        (soniq_queue_holds); its lapsed holds are deleted.
        """
        budget = wanted
        limit = setting.effective_concurrency
        if limit is not None:
            running = self._jobs().filter(status=JobStatus.PROCESSING, queue=setting.queue)
            holds = QueueHold.objects.using(self.alias).filter(queue=setting.queue)
            counts = holds.aggregate(live=Count("id", filter=Q(lease_expires_at__gt=now)),
                                     lapsed=Count("id", filter=Q(lease_expires_at__lte=now)))
            if counts["lapsed"]:
                holds.filter(lease_expires_at__lte=now).delete()
            budget = min(budget, limit - running.count() - counts["live"])
        rate = setting.effective_rate
        if rate is not None:
            count, period = rate
            starts = QueueStart.objects.using(self.alias).filter(queue=setting.queue)
            starts.filter(started_at__lte=now - dt.timedelta(seconds=period)).delete()
            budget = min(budget, count - starts.count())
        return max(budget, 0)

    def recover(self, owner: str, token: str, lock_wait: float | None = None
                ) -> dict[str, Any] | None:
        with self._locked() as now:
            row = self._jobs().filter(claim_token=token).first()
            if (
                row is None or row.claim_token != token or row.claim_owner != owner
                or row.status != JobStatus.PROCESSING or row.lease_expires_at is None
                or row.lease_expires_at <= now
            ):
                return None
            return self._claimed(row)

    def _owned_row(self, f: QueueClaimFence, now: dt.datetime) -> Job | None:
        """The row the fence still owns, compared exactly; None when it does not."""
        row: Job | None = self._jobs().filter(id=uuid.UUID(f.job_id)).first()
        if (
            row is None or str(row.id) != f.job_id or row.queue != f.queue
            or row.claim_owner != f.worker_id or row.claim_token != f.claim_token
            or row.claim_generation != f.generation or row.status != JobStatus.PROCESSING
            or row.lease_expires_at is None or row.lease_expires_at <= now
        ):
            return None
        return row

    def _update_owned(self, row: Job, now: dt.datetime, **values: Any) -> bool:
        changed: int = self._jobs().filter(
            id=row.id, claim_token=row.claim_token, claim_generation=row.claim_generation,
            status=JobStatus.PROCESSING, lease_expires_at__gt=now,
        ).update(updated_at=now, **values)
        return changed == 1

    def heartbeat(self, f: QueueClaimFence, lease: float, lock_wait: float | None = None) -> bool:
        # SQLite has no row locks: its write lock is waited for as every write waits for it
        # (at most the busy timeout, OPTIONS["timeout"]), whatever ``lock_wait`` says.
        return self.heartbeat_many([f], lease)[0] is not None

    def heartbeat_many(self, fences: list[QueueClaimFence], lease: float,
                       lock_wait: float | None = None
                       ) -> list[tuple[bool, int | None] | None]:
        """Renew every lease and read each claim's state, in one write transaction."""
        states: list[tuple[bool, int | None] | None] = []
        with self._locked() as now:
            for f in fences:
                row = self._owned_row(f, now)
                renewed = row is not None and self._update_owned(
                    row, now, lease_expires_at=now + dt.timedelta(seconds=lease))
                states.append((row.cancel_requested, row.pid) if renewed and row else None)
        return states

    def complete(self, f: QueueClaimFence, result: Any, ttl: float,
                 lock_wait: float | None = None, *, held_since: dt.datetime | None = None
                 ) -> bool:
        """The twin of soniq_complete.

        ``held_since``: the caller's transaction has held the write lock
        since then, and the fence was live at that time (an atomic job,
        worker/atomic.py). No one else could write the row since, so the
        lease is checked as of that time: the row is exactly as it was.
        """
        with self._locked() as now:
            checked_at = now if held_since is None else held_since
            row = self._owned_row(f, checked_at)
            if row is None or row.cancel_requested:
                return False
            changed = self._jobs().filter(
                id=row.id, claim_token=row.claim_token, claim_generation=row.claim_generation,
                status=JobStatus.PROCESSING, lease_expires_at__gt=checked_at,
            ).update(status=JobStatus.DONE, result=result, lease_expires_at=None, pid=None,
                     expires_at=now + dt.timedelta(seconds=ttl), updated_at=now)
            done: bool = changed == 1
            return done

    def complete_and_claim(self, completions: list[tuple[QueueClaimFence, Any]], ttl: float,
                           owner: str, tokens: list[str], queues: list[str] | None,
                           lease: float, pid: int | None, lock_wait: float | None = None
                           ) -> tuple[list[bool], list[dict[str, Any]]]:
        with guarded(self.alias, atomic=True) as connection:
            take_sqlite_write_lock(connection)
            completed = [self.complete(f, result, ttl) for f, result in completions]
            claimed = self.claim_many(owner, tokens, queues, lease, ttl, pid) if tokens else []
            return completed, claimed

    def fail(self, f: QueueClaimFence, error: str, retry: bool, delay: float | None,
             reason: str, dlq_record_id: str | None, default_max_attempts: int,
             base: float, cap: float, lock_wait: float | None = None) -> bool:
        with self._locked() as now:
            row = self._owned_row(f, now)
            if row is None or row.cancel_requested:
                return False
            limit = row.max_attempts if row.max_attempts is not None else default_max_attempts
            if retry and row.attempts < limit:
                if delay is None:
                    delay = retry_backoff(row.attempts, base, cap)
                # The row is this claim's (checked after the write lock) until we commit.
                self._requeue(row, error, now + dt.timedelta(seconds=delay), now,
                              FAIL_SUPERSEDED_TTL)
                return True
            self._move_to_dead_letter(
                row.id, error, "max_retries_exceeded" if retry else reason, dlq_record_id, now
            )
            return True

    def defer(self, f: QueueClaimFence, error: str, delay: float, ttl: float,
              lock_wait: float | None = None) -> bool:
        """Give the claim back without counting its attempt: the twin of soniq_defer (v8).

        A deferral is not a start: the start the claim recorded (its time is
        the row's ``updated_at`` until a renewal moves it) is taken back.
        """
        with self._locked() as now:
            row = self._owned_row(f, now)
            if row is None or row.cancel_requested:
                return False
            start = QueueStart.objects.using(self.alias).filter(
                queue=row.queue, started_at=row.updated_at).values_list("pk", flat=True).first()
            if start is not None:
                QueueStart.objects.using(self.alias).filter(pk=start).delete()
            # The row is this claim's (checked after the write lock) until we commit.
            self._jobs().filter(id=row.id).update(attempts=max(row.attempts - 1, 0))
            self._requeue(row, error, now + dt.timedelta(seconds=delay), now, ttl)
            return True

    def fail_and_hold(self, f: QueueClaimFence, lease: float, error: str, retry: bool,
                      delay: float | None, reason: str, dlq_record_id: str | None,
                      default_max_attempts: int, base: float, cap: float,
                      lock_wait: float | None = None) -> bool:
        """The twin of soniq_hold_slot then soniq_fail, in one write transaction."""
        with self._locked() as now:
            row = self._owned_row(f, now)
            if row is not None:
                holds = QueueHold.objects.using(self.alias)
                holds.filter(queue=row.queue, lease_expires_at__lte=now).delete()
                holds.update_or_create(
                    job_id=row.id, generation=row.claim_generation,
                    defaults={"queue": row.queue, "claim_owner": f.worker_id,
                              "lease_expires_at": now + dt.timedelta(seconds=lease)},
                    create_defaults={"queue": row.queue, "claim_owner": f.worker_id,
                                     "lease_expires_at": now + dt.timedelta(seconds=lease),
                                     "created_at": now})
            return self.fail(f, error, retry, delay, reason, dlq_record_id,
                             default_max_attempts, base, cap)

    def release_hold(self, f: QueueClaimFence) -> bool:
        """The twin of soniq_release_hold."""
        with self._locked():
            deleted: int = QueueHold.objects.using(self.alias).filter(
                job_id=uuid.UUID(f.job_id), generation=f.generation,
                claim_owner=f.worker_id).delete()[0]
            return deleted > 0

    def renew_holds(self, owner: str, fences: list[QueueClaimFence], lease: float) -> int:
        """The twin of soniq_renew_holds."""
        with self._locked() as now:
            claims = Q(pk__in=[])
            for f in fences:
                claims |= Q(job_id=uuid.UUID(f.job_id), generation=f.generation)
            renewed: int = QueueHold.objects.using(self.alias).filter(
                claims, claim_owner=owner, lease_expires_at__gt=now,
            ).update(lease_expires_at=now + dt.timedelta(seconds=lease))
            return renewed

    def set_pid(self, f: QueueClaimFence, pid: int) -> bool:
        with self._locked() as now:
            row = self._owned_row(f, now)
            if row is None or row.cancel_requested:
                return False
            return self._update_owned(row, now, pid=pid)

    def set_progress(self, f: QueueClaimFence, done: int, total: int | None,
                     note: str | None, lock_wait: float | None = None) -> bool:
        """soniq_set_progress's twin: written only while the fence holds (the write lock held)."""
        from ..models import JobProgress

        with self._locked() as now:
            if self._owned_row(f, now) is None:
                return False
            JobProgress.objects.using(self.alias).update_or_create(
                job_id=uuid.UUID(f.job_id),
                defaults={"done": done, "total": total, "note": note, "updated_at": now})
            return True

    def get_state(self, f: QueueClaimFence, lock_wait: float | None = None
                  ) -> tuple[bool, int | None] | None:
        with self._locked() as now:
            row = self._owned_row(f, now)
            return None if row is None else (row.cancel_requested, row.pid)

    def acknowledge_cancel(self, f: QueueClaimFence, ttl: float,
                           lock_wait: float | None = None) -> bool:
        with self._locked() as now:
            row = self._owned_row(f, now)
            if row is None or not row.cancel_requested:
                return False
            return self._update_owned(
                row, now, status=JobStatus.CANCELLED, lease_expires_at=None, pid=None,
                expires_at=now + dt.timedelta(seconds=ttl),
            )

    def request_cancel(self, job_id: uuid.UUID, ttl: float) -> bool:
        with self._locked() as now:
            row = self._jobs().filter(id=job_id).values("status", "lease_expires_at").first()
            if row is None or row["status"] not in (JobStatus.QUEUED, JobStatus.PROCESSING):
                return False
            lease = row["lease_expires_at"]
            if row["status"] == JobStatus.QUEUED or lease is None or lease <= now:
                # Queued, or processing with no live worker left to see a request.
                self._jobs().filter(id=job_id).update(
                    status=JobStatus.CANCELLED, lease_expires_at=None, pid=None,
                    cancel_requested=row["status"] == JobStatus.PROCESSING,
                    expires_at=now + dt.timedelta(seconds=ttl), updated_at=now,
                )
            else:
                self._jobs().filter(id=job_id).update(cancel_requested=True, updated_at=now)
            return True


def default_max_attempts(alias: str, job_name: str) -> int:
    """The attempt limit of a job whose ``max_attempts`` is NULL, as the reaper counts it.

    What its handler declares in soniq_task_registry (the largest, when
    workers of several releases disagree), else ``DEFAULT_MAX_ATTEMPTS`` (4)
    -- the twin of soniq_default_max_attempts_v1.
    """
    declared = TaskRegistration.objects.using(alias).filter(
        task_name=job_name, max_attempts__gte=1).aggregate(Max("max_attempts"))
    limit: int = declared["max_attempts__max"] or DEFAULT_MAX_ATTEMPTS
    return limit


def superseded_error(twin_id: uuid.UUID, key: str, error: str) -> str:
    """``last_error`` of a retry finished as superseded (the text soniq_requeue_v1 writes)."""
    return (f"superseded: not queued again because queued job {twin_id} holds the same {key}; "
            f"this attempt ended with: {error}")


def _registered_worker(alias: str, owner: str) -> uuid.UUID | None:
    """The owner as a soniq_workers id, when it is one (worker_id names such a row)."""
    try:
        worker_id = uuid.UUID(owner)
    except ValueError:
        return None
    if str(worker_id) != owner or not Worker.objects.using(alias).filter(id=worker_id).exists():
        return None
    return worker_id


def claims_for(alias: str) -> PostgresClaims | SqliteClaims:
    """The owned-operations implementation for this database alias."""
    vendor = connections[alias].vendor
    if vendor == "postgresql":
        return PostgresClaims(alias)
    if vendor == "sqlite":
        return SqliteClaims(alias)
    raise ConfigValidationError("the owned queue supports PostgreSQL and SQLite only")

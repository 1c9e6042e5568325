"""Rebuilding the ``soniq_jobs`` indexes a pinned horizon left bloated (PostgreSQL; decision 0037).

While a snapshot holds the xmin horizon -- a long report, ``pg_dump``, a
session idle in its transaction, a standby with ``hot_standby_feedback`` --
vacuum removes nothing, and every index of ``soniq_jobs`` grows with every
job. After the release vacuum removes the entries and gives the heap's
empty tail back, but a B-tree never gives pages back to the file system:
the indexes on random keys (the primary key, ``claim_token``) keep pages a
tenth full, and the partial indexes of queued and processing jobs hundreds
of empty ones (docs/performance.md#a-pinned-horizon has the measurements).

So a worker watches the horizon (``HorizonWatch.look``: once a minute, in
its housekeeping turn, one catalog query). A snapshot older than its
previous look still held means a pin is on; SETTLE_LOOKS looks in a row
that find none after that mean the pin is over and vacuum has had its turn,
and the worker runs ``rebuild_bloated`` in a thread of its own, on a
connection of its own:

1. a session advisory lock keyed on ``soniq_jobs`` (``pg_try_advisory_lock``):
   at most one rebuild at a time across workers; when another holds it,
   this one does nothing and tries again at its next look;
2. the leftovers of an interrupted rebuild -- an invalid ``..._ccnew`` index
   of ``soniq_jobs`` -- are dropped (``DROP INDEX CONCURRENTLY``);
3. each index whose size exceeds what its entries need (``BLOATED_SQL``) by
   more than ``MIN_EXCESS_BYTES`` and ``MIN_EXCESS_SHARE`` of the table's
   heap is rebuilt, the most bloated first, one at a time, by ``REINDEX
   INDEX CONCURRENTLY`` (never inside a transaction: writes go on), each
   bounded by ``LOCK_TIMEOUT`` for any lock and ``STATEMENT_TIMEOUT`` in all.
   A failed one is dropped as in 2 and ends the run. A run that rebuilt
   something is followed by one more at the worker's next look (vacuum may
   have given more of the heap back since), which leaves the indexes the
   first rebuilt alone: at most MAX_PASSES runs after a pin, so an index
   that grows back to its steady size is never rebuilt over and over.

What an index needs is estimated from the catalog: ``reltuples`` x (the
index tuple's header, the average widths of its columns' values from
``pg_stats``, a null bitmap as often as a value is null, aligned, and its
line pointer) over the 90 % of a page a B-tree build fills
(``BLOATED_SQL``; tests/test_index_rebuild.py holds it to the size of a
freshly built index).

Never behind a connection pooler (session settings and an advisory lock need
a session of their own), never on SQLite, and not at all when
``SONIQ["REBUILD_INDEXES_AFTER_PIN"]`` is False. Every wait is bounded
(``LOCK_TIMEOUT``, ``STATEMENT_TIMEOUT``); the worker never waits for the
rebuild.
"""

import dataclasses
import logging
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

from .models import Job

logger = logging.getLogger("soniq_django.worker")

#: Rebuild an index only when it exceeds what its entries need by this much ...
MIN_EXCESS_BYTES = 1024 * 1024
#: ... and by this share of the table's heap (a partial index of queued jobs holds about a
#: minute of churn between two vacuums: 2-10 % of the heap at steady load).
MIN_EXCESS_SHARE = 0.05
#: The longest wait for any one lock of a rebuild (the table's, old transactions' ends).
LOCK_TIMEOUT = "2s"
#: The longest one rebuild may take.
STATEMENT_TIMEOUT = "10min"
#: Looks in a row (a minute apart in a worker) that find the horizon free before a rebuild.
SETTLE_LOOKS = 3
#: Rebuild runs after one pin: the first, and one more once the heap has shrunk.
MAX_PASSES = 2
#: The advisory lock's key: soniq_jobs' oid, shifted, and this.
ADVISORY_KEY = 27
ADVISORY_SQL = "(%s::regclass::oid::bigint << 8) | " + str(ADVISORY_KEY)

#: The next transaction id, and whether something older than ``mark`` (a 32-bit transaction
#: id from the previous look, or NULL; the first id handed out after that look, so an id or
#: xmin equal to it began after the look and is not older) holds the horizon of soniq_jobs,
#: as vacuum reckons it:
#: a snapshot of a session in this database, or of one in no database (a walsender's: a
#: standby's hot_standby_feedback without a slot) -- a snapshot in another database holds
#: only the shared catalogs -- the transaction id of a writing session in any database, a
#: replication slot's, a prepared transaction's. Every role may read these.
HORIZON_SQL = """
SELECT pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text,
       %(mark)s::text IS NOT NULL AND EXISTS (
           SELECT FROM (SELECT backend_xmin AS x FROM pg_catalog.pg_stat_activity
                         WHERE pid <> pg_catalog.pg_backend_pid()
                           AND (datid IS NULL OR datid = (
                                SELECT oid FROM pg_catalog.pg_database
                                 WHERE datname = pg_catalog.current_database()))
                        UNION ALL
                        SELECT backend_xid FROM pg_catalog.pg_stat_activity
                         WHERE pid <> pg_catalog.pg_backend_pid()
                        UNION ALL
                        SELECT xmin FROM pg_catalog.pg_replication_slots
                        UNION ALL
                        SELECT transaction FROM pg_catalog.pg_prepared_xacts) AS held
            WHERE held.x IS NOT NULL
              AND pg_catalog.age(held.x) > pg_catalog.age(%(mark)s::text::xid))
"""

#: Each valid index of soniq_jobs: its name (as regclass prints it: quoted, schema-qualified
#: when off the search path), its size, the size its entries need (NULL when the catalog
#: cannot tell: never analyzed, an expression), and the table's heap size.
BLOATED_SQL = """
SELECT c.oid::regclass::text, pg_catalog.pg_relation_size(c.oid),
       CASE WHEN c.reltuples >= 0 AND w.width IS NOT NULL AND 0 <> ALL (i.indkey::int2[])
            THEN (pg_catalog.ceil(c.reltuples * (pg_catalog.ceil((8 + w.width) / 8) * 8 + 4)
                                  / (8152 * 0.9)) + 2) * 8192 END,
       pg_catalog.pg_relation_size(i.indrelid)
  FROM pg_catalog.pg_index AS i
  JOIN pg_catalog.pg_class AS c ON c.oid = i.indexrelid
  CROSS JOIN LATERAL (
      SELECT CASE WHEN pg_catalog.count(s.avg_width) = pg_catalog.count(*)
                  THEN pg_catalog.sum(s.avg_width * (1 - s.null_frac))
                       + 8 * pg_catalog.max(s.null_frac) END AS width
        FROM pg_catalog.unnest(i.indkey::int2[]) AS k(attnum)
        JOIN pg_catalog.pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
        JOIN pg_catalog.pg_class AS t ON t.oid = i.indrelid
        JOIN pg_catalog.pg_namespace AS n ON n.oid = t.relnamespace
        LEFT JOIN pg_catalog.pg_stats AS s
               ON s.schemaname = n.nspname AND s.tablename = t.relname
              AND s.attname = a.attname AND NOT s.inherited) AS w
 WHERE i.indrelid = %(table)s::regclass AND i.indisvalid AND i.indisready
"""

#: What an interrupted REINDEX CONCURRENTLY leaves: an invalid copy named ``<index>_ccnew``
#: (``_ccnew1``, ...) of an index of soniq_jobs.
LEFTOVERS_SQL = """
SELECT c.oid::regclass::text
  FROM pg_catalog.pg_index AS i JOIN pg_catalog.pg_class AS c ON c.oid = i.indexrelid
 WHERE i.indrelid = %(table)s::regclass AND NOT i.indisvalid
   AND c.relname ~ '_ccnew[0-9]*$'
"""


class HorizonWatch:
    """Tells, one look at a time, when a pinned horizon was released long enough ago.

    ``look(cursor)`` returns True at the SETTLE_LOOKS-th look in a row that
    finds the horizon free after one or more looks found it held by a
    snapshot older than the look before them: by then vacuum has removed
    what the pin kept and given the heap's empty tail back, so a rebuild
    reads a table of its usual size, and the drain has caught up. Until a
    rebuild reports back (``done()``), every later look returns True again
    (another worker may hold the lock).
    """

    def __init__(self) -> None:
        self.mark: str | None = None
        self.pinned = False
        self.free = 0  # looks in a row that found the horizon free since a pin
        self.due = False

    def look(self, cursor: Any) -> bool:
        cursor.execute(HORIZON_SQL, {"mark": self.mark})
        next_xid, held = cursor.fetchone()
        self.mark = str(int(next_xid) % 2**32)
        if held:
            self.pinned, self.free, self.due = True, 0, False
            return False
        if self.pinned:
            self.free += 1
            if self.free >= SETTLE_LOOKS:
                self.pinned, self.due = False, True
        return self.due

    def done(self) -> None:
        self.due = False


@dataclasses.dataclass(frozen=True, slots=True)
class Bloated:
    """An index of soniq_jobs: its name, size and the size its entries need (bytes)."""

    name: str
    size: int
    needed: int

    @property
    def excess(self) -> int:
        return self.size - self.needed


def bloated(cursor: Any, table: str) -> list[Bloated]:
    """The indexes of ``table`` worth rebuilding, the most bloated first."""
    cursor.execute(BLOATED_SQL, {"table": table})
    found = []
    for name, size, needed, heap in cursor.fetchall():
        if needed is None:
            continue
        index = Bloated(name, int(size), int(needed))
        if index.excess > max(MIN_EXCESS_BYTES, MIN_EXCESS_SHARE * int(heap)):
            found.append(index)
    return sorted(found, key=lambda index: -index.excess)


@dataclasses.dataclass(frozen=True, slots=True)
class Rebuilt:
    """What one ``rebuild_bloated`` did: ``busy`` (another holds the lock), the indexes
    rebuilt with their sizes before and after, the leftovers dropped, and the SQLSTATE of
    the failure that ended it, if one did."""

    busy: bool = False
    rebuilt: tuple[tuple[str, int, int], ...] = ()
    dropped: tuple[str, ...] = ()
    failed: str | None = None


def rebuild_bloated(using: str = DEFAULT_DB_ALIAS, *, skip: frozenset[str] = frozenset()
                    ) -> Rebuilt:
    """Rebuild the bloated indexes of soniq_jobs, on this thread's own connection to ``using``.

    ``skip`` names indexes left alone (those an earlier pass after the same pin rebuilt).
    Autocommit only (REINDEX CONCURRENTLY cannot run in a transaction): raises
    RuntimeError inside ``atomic()``. Returns what was done (``Rebuilt``);
    a database error ends the run and is reported in it, never raised.
    """
    connection = connections[using]
    if connection.in_atomic_block:
        raise RuntimeError("rebuild_bloated() cannot run inside a transaction")
    table = connection.ops.quote_name(Job._meta.db_table)
    rebuilt: list[tuple[str, int, int]] = []
    dropped: list[str] = []
    with connection.cursor() as cursor:
        cursor.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
        cursor.execute(f"SET statement_timeout = '{STATEMENT_TIMEOUT}'")
        cursor.execute(f"SELECT pg_catalog.pg_try_advisory_lock({ADVISORY_SQL})", [table])
        if not cursor.fetchone()[0]:
            return Rebuilt(busy=True)
        try:
            dropped += _drop_leftovers(cursor, table)
            for index in bloated(cursor, table):
                if index.name in skip:
                    continue
                cursor.execute(f"REINDEX INDEX CONCURRENTLY {index.name}")
                cursor.execute("SELECT pg_catalog.pg_relation_size(%s::regclass)", [index.name])
                rebuilt.append((index.name, index.size, int(cursor.fetchone()[0])))
        except DatabaseError as error:
            code = getattr(getattr(error, "__cause__", None), "sqlstate", None) or "?"
            try:
                dropped += _drop_leftovers(cursor, table)
            except DatabaseError:
                pass  # the next rebuild drops them
            return Rebuilt(rebuilt=tuple(rebuilt), dropped=tuple(dropped), failed=code)
        finally:
            try:
                cursor.execute(f"SELECT pg_catalog.pg_advisory_unlock({ADVISORY_SQL})", [table])
            except DatabaseError:
                pass  # a connection that broke has no lock left
    return Rebuilt(rebuilt=tuple(rebuilt), dropped=tuple(dropped))


def _drop_leftovers(cursor: Any, table: str) -> list[str]:
    cursor.execute(LEFTOVERS_SQL, {"table": table})
    names = [name for (name,) in cursor.fetchall()]
    for name in names:
        cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
    return names

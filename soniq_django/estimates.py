"""Counts and values that stay cheap on a big table: the planner's estimates where reading would scan.

On PostgreSQL a query's plan says, before it runs, how many rows it
expects and what reading them costs (``EXPLAIN``). ``plan()`` asks for it;
``count()`` counts exactly when that cost is at most ``COST_LIMIT`` (an
index reads the rows, or the table is small), and otherwise returns the
planner's row estimate, marked as such, without reading a row.
``common_values()`` lists a column's values as ANALYZE saw them
(``pg_stats``), where ``SELECT DISTINCT`` would read every row; and
``frequencies()`` gives each value's share of the rows, for counts by
value that read no row (``table_rows()`` times a share).

On SQLite, and on PostgreSQL before a table was ever analyzed, every
answer is exact: ``plan()`` is None there. See docs/admin.md, "How the
pages stay cheap on big tables", and docs/decisions/0040-admin-at-a-million-rows.md.
"""

import json
from dataclasses import dataclass
from typing import Any

from django.db import connections
from django.db.models import Model, QuerySet

COST_LIMIT = 10_000.0
"""The largest planner cost (EXPLAIN's ``Total Cost``) counted exactly.

A sequential read of a table costs about one unit a page (8 kB) and a
hundredth a row, so 10,000 is a table of about 50 MB (some 100,000 jobs)
read in full, or an index's few hundred thousand entries: tens of
milliseconds. Above it, ``count()`` gives the planner's estimate."""


@dataclass(frozen=True)
class Plan:
    """What the planner expects of a query: rows returned and the cost of reading them."""

    rows: int
    cost: float


@dataclass(frozen=True)
class Count:
    """A number of rows, and whether it is the planner's estimate rather than a count."""

    value: int
    estimated: bool


def estimating(using: str) -> bool:
    """Whether database ``using`` can estimate (PostgreSQL), so counts may be estimates there."""
    return bool(connections[using].vendor == "postgresql")


def plan(queryset: QuerySet) -> Plan | None:
    """The planner's rows and cost for ``queryset`` (PostgreSQL; None elsewhere). Runs nothing."""
    using = queryset.db
    connection = connections[using]
    if connection.vendor != "postgresql":
        return None
    sql, params = queryset.query.get_compiler(using=using).as_sql()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        found: Any = cursor.fetchone()[0]
    top = (json.loads(found) if isinstance(found, str) else found)[0]["Plan"]
    return Plan(rows=int(top["Plan Rows"]), cost=float(top["Total Cost"]))


def cheap(queryset: QuerySet, limit: float | None = None) -> bool:
    """Whether reading every row of ``queryset`` costs at most ``limit`` (COST_LIMIT).

    Always True where nothing is estimated (SQLite).
    """
    found = plan(queryset)
    return found is None or found.cost <= (COST_LIMIT if limit is None else limit)


def count(queryset: QuerySet, limit: float | None = None) -> Count:
    """``queryset``'s rows: counted when that is cheap (``cheap``), else the planner's estimate."""
    unordered = queryset.order_by()
    found = plan(unordered)
    if found is None or found.cost <= (COST_LIMIT if limit is None else limit):
        return Count(unordered.count(), estimated=False)
    return Count(found.rows, estimated=True)


def table_rows(using: str, model: type[Model]) -> int | None:
    """The rows of ``model``'s table as its statistics say (None: never analyzed, or SQLite)."""
    if not estimating(using):
        return None
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT reltuples::bigint FROM pg_catalog.pg_class "
                       "WHERE oid = to_regclass(%s)", [_table(using, model)])
        row = cursor.fetchone()
    return None if row is None or row[0] < 0 else int(row[0])


def frequencies(using: str, model: type[Model], column: str) -> dict[str, float] | None:
    """{value: share of the rows} of a text column, from ANALYZE's most common values.

    A value ANALYZE did not list among them is left out (it is rare: less
    than any listed one). None when the column has no statistics.
    """
    row = _stats(using, model, column)
    if row is None or row[0] is None:
        return None
    return dict(zip(row[0], (float(f) for f in row[1] or ()), strict=False))


def common_values(using: str, model: type[Model], column: str) -> list[str] | None:
    """The values of a text column that ANALYZE saw (most common ones, histogram bounds).

    Sorted; None when the column has no statistics. A value rarer than one
    row in every few thousand may be missing.
    """
    row = _stats(using, model, column)
    if row is None:
        return None
    return sorted({*(row[0] or ()), *(row[2] or ())})


def _stats(using: str, model: type[Model], column: str) -> tuple[Any, ...] | None:
    if not estimating(using):
        return None
    # pg_stats shows the columns this role may read; the arrays are anyarray,
    # so they are read as text[] (the column is text).
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT most_common_vals::text::text[], most_common_freqs, "
            "histogram_bounds::text::text[] FROM pg_catalog.pg_stats "
            "WHERE schemaname = current_schema() AND tablename = %s AND attname = %s",
            [model._meta.db_table, column])
        row = cursor.fetchone()
    return None if row is None else tuple(row)


def _table(using: str, model: type[Model]) -> str:
    return str(connections[using].ops.quote_name(model._meta.db_table))

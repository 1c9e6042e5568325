"""Read-only facts about columns and indexes, on PostgreSQL and SQLite.

The admission checks (``soniq_django.admission``) judge these facts and the
owned-schema DDL (``soniq_django.schema.owned_metadata``) uses them to add only what
is missing and to drop what uses an owned column. Nothing here writes.
"""

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class ColumnFacts:
    """One column as the database declares it."""

    type: str
    """PostgreSQL: ``format_type()``; SQLite: the declared type, lower-cased."""
    not_null: bool
    default: str | None
    """The default expression as the catalog shows it; None when there is none."""
    collation: str | None
    """The declared collation name; None when the column declares none."""
    deterministic: bool
    """False only for a PostgreSQL collation that compares distinct strings as equal."""
    generated: bool
    """An identity or generated column: the database makes its values."""


@dataclass(frozen=True, kw_only=True)
class IndexFacts:
    """One index (or unique constraint) that uses a given column."""

    name: str
    unique: bool
    partial: bool
    expression: bool
    columns: int
    """How many columns the index holds, key and included ones alike."""
    collation: str | None
    """The collation of the index's entry for the column; None for an expression."""
    default_opclass: bool
    nulls_not_distinct: bool = False
    valid: bool = True
    deferrable: bool = False


# --------------------------------------------------------------------------
# Entry points


def column_facts(connection: Any, table: str, column: str) -> ColumnFacts | None:
    """The facts of ``table.column``, or None when the column does not exist."""
    if connection.vendor == "postgresql":
        return _pg_column(connection, table, column)
    return _sqlite_column(connection, table, column)


def indexes_on(connection: Any, table: str, column: str) -> list[IndexFacts]:
    """Every index of ``table`` whose entries use ``column`` (as a key or in an expression)."""
    if connection.vendor == "postgresql":
        return _pg_indexes(connection, table, column)
    return _sqlite_indexes(connection, table, column)


def name_taken(connection: Any, table: str, name: str) -> bool:
    """Whether an index, constraint or other schema object is already called ``name``."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # Index names share one namespace with tables and sequences;
            # constraint names are per table.
            cursor.execute(
                "SELECT to_regclass(%s) IS NOT NULL OR EXISTS (SELECT 1 FROM pg_constraint "
                "WHERE conrelid = to_regclass(%s) AND conname = %s)",
                [_quoted(connection, name), _quoted(connection, table), name],
            )
        else:
            cursor.execute("SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE name = %s)", [name])
        return bool(cursor.fetchone()[0])


def _quoted(connection: Any, name: str) -> str:
    quoted: str = connection.ops.quote_name(name)
    return quoted


# --------------------------------------------------------------------------
# PostgreSQL

_PG_COLUMN = """
SELECT pg_catalog.format_type(a.atttypid, a.atttypmod), a.attnotnull,
       pg_catalog.pg_get_expr(d.adbin, d.adrelid),
       CASE WHEN a.attcollation = 0 THEN NULL ELSE c.collname END,
       COALESCE(c.collisdeterministic, true),
       a.attidentity <> '' OR a.attgenerated <> ''
FROM pg_catalog.pg_attribute a
LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
LEFT JOIN pg_catalog.pg_collation c ON c.oid = a.attcollation
WHERE a.attrelid = to_regclass(%s) AND a.attname = %s AND a.attnum > 0 AND NOT a.attisdropped
"""


def _pg_column(connection: Any, table: str, column: str) -> ColumnFacts | None:
    with connection.cursor() as cursor:
        cursor.execute(_PG_COLUMN, [_quoted(connection, table), column])
        row = cursor.fetchone()
    if row is None:
        return None
    kind, not_null, default, collation, deterministic, generated = row
    if default is not None and re.fullmatch(r"(?i)null(::.*)?", default.strip("() ")):
        default = None  # "DEFAULT NULL" is stored, but is no default
    return ColumnFacts(type=kind, not_null=not_null, default=default, collation=collation,
                       deterministic=deterministic, generated=generated)


# pg_depend finds the indexes whose expressions use the column; indkey the
# plain ones. An index that mentions the column only in its WHERE clause is
# filtered out in Python (it does not index the column's values).
_PG_INDEXES = """
SELECT ic.relname, i.indisunique, i.indpred IS NOT NULL, i.indexprs IS NOT NULL,
       i.indnatts, %(att)s = ANY (i.indkey::int2[]),
       (SELECT ko.collname FROM pg_catalog.pg_collation ko
        -- both vectors keep their 0-based subscripts through the casts
        WHERE ko.oid = (i.indcollation::oid[])[array_position(i.indkey::int2[], %(att)s)]),
       (SELECT bool_and(o.opcdefault) FROM unnest(i.indclass::oid[]) AS u(oid)
        JOIN pg_catalog.pg_opclass o ON o.oid = u.oid),
       {nulls_not_distinct}, i.indisvalid, NOT i.indimmediate
FROM pg_catalog.pg_index i
JOIN pg_catalog.pg_class ic ON ic.oid = i.indexrelid
WHERE i.indrelid = %(table)s::regclass AND (
    %(att)s = ANY (i.indkey::int2[]) OR EXISTS (
        SELECT 1 FROM pg_catalog.pg_depend dep
        WHERE dep.classid = 'pg_catalog.pg_class'::regclass AND dep.objid = i.indexrelid
          AND dep.refclassid = 'pg_catalog.pg_class'::regclass
          AND dep.refobjid = i.indrelid AND dep.refobjsubid = %(att)s))
ORDER BY ic.relname
"""


def _pg_indexes(connection: Any, table: str, column: str) -> list[IndexFacts]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT attnum FROM pg_catalog.pg_attribute WHERE attrelid = to_regclass(%s) "
            "AND attname = %s AND NOT attisdropped",
            [_quoted(connection, table), column],
        )
        row = cursor.fetchone()
        if row is None:
            return []
        # NULLS NOT DISTINCT exists from PostgreSQL 15 on.
        nnd = "i.indnullsnotdistinct" if connection.pg_version >= 150000 else "false"
        cursor.execute(_PG_INDEXES.format(nulls_not_distinct=nnd),
                       {"att": row[0], "table": _quoted(connection, table)})
        rows = cursor.fetchall()
    indexes = []
    for (name, unique, partial, expression, columns, is_key, collation, default_opclass,
         nulls_not_distinct, valid, deferrable) in rows:
        if not is_key and not expression:
            continue  # the column appears only in the WHERE clause
        indexes.append(IndexFacts(
            name=name, unique=unique, partial=partial, expression=expression, columns=columns,
            collation=collation if is_key else None, default_opclass=bool(default_opclass),
            nulls_not_distinct=nulls_not_distinct, valid=valid, deferrable=deferrable,
        ))
    return indexes


def pg_default_collation_deterministic(connection: Any) -> bool:
    """Whether the database's default collation tells distinct strings apart.

    Reads the catalog flag of the ``default`` collation and also asks the
    server: case and trailing spaces must make strings unequal.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT collisdeterministic FROM pg_catalog.pg_collation "
            "        WHERE collname = 'default' AND collnamespace = 'pg_catalog'::regnamespace)"
            " AND 'a'::varchar <> 'A'::varchar AND 'a'::varchar <> 'a '::varchar"
            " AND 'a'::text <> 'A'::text"
        )
        return bool(cursor.fetchone()[0])


# --------------------------------------------------------------------------
# SQLite


def _sqlite_column(connection: Any, table: str, column: str) -> ColumnFacts | None:
    with connection.cursor() as cursor:
        cursor.execute(f"PRAGMA table_xinfo({_quoted(connection, table)})")
        rows = [row for row in cursor.fetchall() if row[1] == column]
        if not rows:
            return None
        _cid, _name, kind, not_null, default, _pk, hidden = rows[0]
        cursor.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = %s", [table])
        (table_sql,) = cursor.fetchone()
    if default is not None and default.strip("() ").lower() == "null":
        default = None
    return ColumnFacts(
        type=" ".join((kind or "").lower().split()), not_null=bool(not_null), default=default,
        collation=_sqlite_declared_collation(table_sql, column), deterministic=True,
        generated=hidden in (2, 3),  # 2 and 3: generated (virtual, stored)
    )


_STRING_LITERAL = re.compile(r"'(?:[^']|'')*'")
_IDENTIFIER = r'(?:"(?:[^"]|"")*"|`[^`]*`|\[[^\]]*\]|[A-Za-z_][A-Za-z0-9_$]*)'


def _sqlite_declared_collation(table_sql: str, column: str) -> str | None:
    """The ``COLLATE`` name in ``column``'s definition inside ``CREATE TABLE``, if any."""
    body = _STRING_LITERAL.sub("''", table_sql)  # a default may contain the word COLLATE
    body = body[body.index("(") + 1: body.rindex(")")]
    for definition in _top_level_split(body):
        match = re.match(rf"\s*({_IDENTIFIER})", definition)
        if match and _unquote(match.group(1)).lower() == column.lower():
            collate = re.search(rf"(?i)\bCOLLATE\s+({_IDENTIFIER})", definition)
            return _unquote(collate.group(1)).upper() if collate else None
    return None


def _top_level_split(body: str) -> list[str]:
    """``body`` split at the commas that are not inside parentheses."""
    parts, depth, start = [], 0, 0
    for position, char in enumerate(body):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(body[start:position])
            start = position + 1
    return parts + [body[start:]]


def _unquote(identifier: str) -> str:
    if identifier[:1] in "\"`[":
        return identifier[1:-1].replace('""', '"')
    return identifier


def _sqlite_indexes(connection: Any, table: str, column: str) -> list[IndexFacts]:
    with connection.cursor() as cursor:
        cursor.execute(f"PRAGMA index_list({_quoted(connection, table)})")
        listed = cursor.fetchall()
        indexes = []
        for _seq, name, unique, _origin, partial in listed:
            cursor.execute(f"PRAGMA index_xinfo({_quoted(connection, name)})")
            entries = [row for row in cursor.fetchall() if row[5]]  # key entries only
            cursor.execute("SELECT sql FROM sqlite_master WHERE name = %s", [name])
            found = cursor.fetchone()
            facts = _sqlite_index(name, unique, partial, entries, found and found[0], column)
            if facts is not None:
                indexes.append(facts)
    return indexes


def _sqlite_index(name: str, unique: int, partial: int, entries: list[tuple[Any, ...]],
                  sql: str | None, column: str) -> IndexFacts | None:
    """IndexFacts for one SQLite index if it uses ``column``, else None."""
    # index_xinfo rows: (seqno, cid, name, desc, collation, key); cid -2 is an expression.
    expression = any(cid == -2 for _s, cid, *_rest in entries)
    own = [entry for entry in entries if (entry[2] or "").lower() == column.lower()]
    # SQLite does not say which column an expression reads: the index's SQL is the
    # only witness. A word match may over-report; refusing too much is the safe side.
    mentioned = expression and sql and re.search(rf'(?i)(?<![\w$]){re.escape(column)}(?![\w$])',
                                                 _STRING_LITERAL.sub("''", sql))
    if not own and not mentioned:
        return None
    return IndexFacts(
        name=name, unique=bool(unique), partial=bool(partial), expression=expression,
        columns=len(entries), collation=own[0][4].upper() if own else None,
        default_opclass=True,
    )

"""Admission checks for the owned-queue metadata (migration 0003).

Before 0003 changes anything it judges what already exists: an owned column
or index may have been made by hand or by another tool, and it is adopted
only when it compares identities exactly and keeps old rows valid. After
0003, the same checks say whether the owned schema is still as required.

Each refusal is a :class:`Problem` naming the table, the column or index and
the rule broken (ids below, explained in docs/schema-admission.md).
"""

import re
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction

from ..errors import SchemaAdmissionError
from . import catalog
from .catalog import ColumnFacts, IndexFacts
from .owned_metadata import (
    OWNED_COLUMNS, OWNED_HELPERS, PG_OWNED_HELPERS, UNIQUE_IDENTITIES, OwnedColumn,
    owned_schema_applied,
)

#: Rule id -> what the rule demands.
RULES = {
    "varchar-required": "owned string metadata must be VARCHAR (not CHAR, text or another type)",
    "varchar-length": "a VARCHAR length, if declared, must hold 255 characters",
    "column-type": "the column must have the type migration 0003 declares",
    "nullability": "NOT NULL for claim_generation and the flags, NULL allowed for the rest",
    "identity-default": "an identity column must have no default (a default manufactures identity)",
    "generation-default": "claim_generation must default to 0",
    "boolean-default": "a flag must default to false",
    "column-default": "the column must have no default",
    "generated-column": "the database must not generate the column's values",
    "collation-deterministic": "the column's collation must be deterministic",
    "collation-binary": "the column must compare with SQLite's BINARY collation",
    "database-collation": "the database's default collation must tell 'a', 'A' and 'a ' apart",
    "sqlite-binary-probe": "columns declared as 0003 declares them must compare bytes exactly",
    "index-not-unique": "an index on an identity column must be unique",
    "index-partial": "an index on an identity column must cover every row (no WHERE)",
    "index-expression": "an index on an identity column must index the column, not an expression",
    "index-multi-column": "an index on an identity column must hold that one column only",
    "index-collation": "the index must compare with the column's own (binary) collation",
    "index-opclass": "the index must use the default operator class",
    "index-nulls-not-distinct": "the index must let many rows have no identity (NULLS DISTINCT)",
    "index-deferrable": "the unique index must be checked at once, not deferred",
    "index-invalid": "the index must be valid (a failed concurrent build is not)",
    "index-missing": "the identity column must have its exact unique index",
    "column-missing": "every owned column must exist once 0003 is applied",
    "object-missing": "every index and constraint 0003 creates must exist once it is applied",
    "name-taken": "a name migration 0003 creates must be free",
    "legacy-values": "existing rows must hold no owned values (old rows start empty)",
}

_PROBE_TABLE = "soniq_admission_probe"


@dataclass(frozen=True, kw_only=True)
class Problem:
    """One reason the owned schema cannot be admitted."""

    table: str
    name: str
    """The column, index or constraint the problem is about ("" for the database)."""
    rule: str
    message: str


def _problem(table: str, name: str, rule: str, detail: str = "") -> Problem:
    where = f"{table}.{name}" if name else table
    text = f"{where}: {RULES[rule]}" + (f" ({detail})" if detail else "") + f" [rule {rule}]"
    return Problem(table=table, name=name, rule=rule, message=text)


# --------------------------------------------------------------------------
# Entry points


def check_owned_schema(connection: Any, *, applied: bool | None = None) -> list[Problem]:
    """Every problem with the owned schema on ``connection``; empty when admissible.

    ``applied`` says whether migration 0003 is in place (default: ask Django's
    migration table). Before it, only what already exists is judged; after
    it, everything 0003 creates must also be there.
    """
    if applied is None:
        applied = owned_schema_applied(connection)
    problems = _database_problems(connection)
    for column in OWNED_COLUMNS:
        problems += _owned_column_problems(connection, column, applied)
    for table, column_name, _name in UNIQUE_IDENTITIES:
        problems += _identity_index_problems(connection, table, column_name, applied)
    problems += _helper_problems(connection, applied)
    return problems


def admit_owned_schema(connection: Any, *, applied: bool | None = None) -> None:
    """Raise ``SchemaAdmissionError`` listing every problem; return None when admissible."""
    problems = check_owned_schema(connection, applied=applied)
    if problems:
        raise SchemaAdmissionError(problems)


def check_report(connection: Any) -> tuple[list[str], list[Problem]]:
    """What ``soniq_check_schema`` prints: (ok lines, problems)."""
    applied = owned_schema_applied(connection)
    problems = check_owned_schema(connection, applied=applied)
    refused = {(problem.table, problem.name) for problem in problems}
    state = "applied" if applied else "not applied"
    lines = [f"migration 0003 (owned queue) is {state}"]
    for column in OWNED_COLUMNS:
        if (column.table, column.name) in refused:
            continue
        absent = catalog.column_facts(connection, column.table, column.name) is None
        note = " (absent; 0003 adds it)" if absent else ""
        lines.append(f"ok {column.table}.{column.name}{note}")
    if not any(problem.name == "" for problem in problems):
        lines.append(f"ok {connection.vendor} collation compares identities exactly")
    return lines, problems


# --------------------------------------------------------------------------
# The database as a whole


def _database_problems(connection: Any) -> list[Problem]:
    if connection.vendor == "postgresql":
        if not catalog.pg_default_collation_deterministic(connection):
            return [_problem("database", "", "database-collation")]
        return []
    if not sqlite_binary_probe(connection):
        return [_problem("database", "", "sqlite-binary-probe")]
    return []


def sqlite_binary_probe(connection: Any) -> bool:
    """Whether SQLite, on this connection, compares the identity columns byte for byte.

    Creates a temporary table declared as 0003 declares the identity columns,
    with unique indexes, inside a savepoint that is always rolled back: no
    probe object or row is left behind. Returns True when 'a', 'A' and 'a '
    are three different values that the unique indexes all accept.
    """
    columns = [c for c in OWNED_COLUMNS if c.table == "soniq_jobs" and c.name in
               ("claim_token", "submission_id")]
    with transaction.atomic(using=connection.alias):
        try:
            with connection.cursor() as cursor:
                return _run_probe(cursor, columns)
        finally:
            # Always undone, whatever the outcome: the probe leaves nothing behind.
            transaction.set_rollback(True, using=connection.alias)


def _run_probe(cursor: Any, columns: list[OwnedColumn]) -> bool:
    values = ("a", "A", "a ")
    cursor.execute(f'CREATE TEMP TABLE "{_PROBE_TABLE}" '
                   f'({", ".join(column.ddl("sqlite") for column in columns)})')
    for column in columns:
        cursor.execute(f'CREATE UNIQUE INDEX temp."{_PROBE_TABLE}_{column.name}" '
                       f'ON "{_PROBE_TABLE}" ("{column.name}")')
    try:
        with transaction.atomic(using=cursor.db.alias):
            for value in values:
                cursor.execute(f'INSERT INTO "{_PROBE_TABLE}" VALUES (%s, %s)', [value, value])
    except IntegrityError:
        return False  # a unique index took two of the values for one
    # Each value must match itself only, read through the index and (unary +
    # keeps the column's collation but bars the index) by a scan.
    for column in columns:
        for value in values:
            cursor.execute(f'SELECT count(*) FROM "{_PROBE_TABLE}" WHERE "{column.name}" = %s',
                           [value])
            by_index = cursor.fetchone()[0]
            cursor.execute(f'SELECT count(*) FROM "{_PROBE_TABLE}" WHERE +"{column.name}" = %s',
                           [value])
            if (by_index, cursor.fetchone()[0]) != (1, 1):
                return False
    return True


# --------------------------------------------------------------------------
# Columns


def _owned_column_problems(connection: Any, column: OwnedColumn, applied: bool
                           ) -> list[Problem]:
    facts = catalog.column_facts(connection, column.table, column.name)
    if facts is None:
        return [_problem(column.table, column.name, "column-missing")] if applied else []
    problems = [_problem(column.table, column.name, rule, detail)
                for rule, detail in column_rules(column, facts, connection.vendor)]
    if not problems and not applied and _holds_values(connection, column):
        problems.append(_problem(column.table, column.name, "legacy-values",
                                 "rows already hold values in it"))
    return problems


def column_rules(column: OwnedColumn, facts: ColumnFacts, vendor: str
                 ) -> list[tuple[str, str]]:
    """(rule, detail) for every rule ``facts`` breaks for the owned ``column``."""
    broken = _type_rules(column, facts, vendor)
    if facts.not_null != (column.not_null_default is not None):
        expected = "NOT NULL" if column.not_null_default is not None else "NULL allowed"
        broken.append(("nullability", f"expected {expected}"))
    if facts.generated:
        broken.append(("generated-column", ""))
    default_rule = _default_rule(column, facts.default, vendor)
    if default_rule:
        broken.append((default_rule, f"default is {_shorten(facts.default)}"))
    if column.kind == "varchar":
        if vendor == "postgresql" and not facts.deterministic:
            broken.append(("collation-deterministic", f"collation {facts.collation}"))
        if vendor != "postgresql" and facts.collation not in (None, "BINARY"):
            broken.append(("collation-binary", f"declared COLLATE {facts.collation}"))
    return broken


_PG_TYPES = {
    "bigint": {"bigint"},
    "boolean": {"boolean"},
    "integer": {"integer", "bigint"},
    "timestamp": {"timestamp with time zone"},
}
_SQLITE_TYPES = {"boolean": {"bool", "boolean"}, "timestamp": {"datetime", "timestamp"}}


def _type_rules(column: OwnedColumn, facts: ColumnFacts, vendor: str) -> list[tuple[str, str]]:
    if column.kind == "varchar":
        match = re.fullmatch(r"(?:varchar|character varying)\s*(?:\(\s*(\d+)\s*\))?", facts.type)
        if match is None:
            fixed = " (fixed CHAR pads values)" if re.match(r"(n?char|character|bpchar)\b",
                                                            facts.type) else ""
            return [("varchar-required", f"found {facts.type or 'no type'}{fixed}")]
        if match.group(1) and int(match.group(1)) < 255:
            return [("varchar-length", f"found {facts.type}")]
        return []
    if vendor == "postgresql":
        accepted = facts.type in _PG_TYPES[column.kind]
    elif column.kind in _SQLITE_TYPES:
        accepted = facts.type in _SQLITE_TYPES[column.kind]
    else:
        accepted = "int" in facts.type  # SQLite's INTEGER affinity
    return [] if accepted else [("column-type", f"found {facts.type or 'no type'}")]


def _default_rule(column: OwnedColumn, default: str | None, vendor: str) -> str | None:
    """The default rule ``default`` breaks for ``column``, or None."""
    bare = re.sub(r"[()\s]", "", default or "").lower()
    if column.kind == "varchar":
        return "identity-default" if default is not None else None
    if column.name == "claim_generation":
        # Safe quoted numeric zero: 0, '0', '0'::bigint and the like.
        zero = re.fullmatch(r"(0|'0')(::(bigint|integer|smallint|int8|int4))?", bare)
        return None if zero else "generation-default"
    if column.kind == "boolean":
        if vendor == "postgresql":
            valid = bare in ("false", "'false'::boolean")
        else:
            # SQLite keeps a quoted 'false' as text, which is not 0.
            valid = bare in ("0", "'0'", "false")
        return None if valid else "boolean-default"
    return "column-default" if default is not None else None


def _shorten(text: str | None, limit: int = 60) -> str:
    text = "none" if text is None else text
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _holds_values(connection: Any, column: OwnedColumn) -> bool:
    """Whether any existing row has a value other than a genuine old row's in ``column``."""
    name = connection.ops.quote_name(column.name)
    if column.kind == "boolean":
        false = "false" if connection.vendor == "postgresql" else "0"
        condition = f"{name} IS NULL OR {name} <> {false}"
    elif column.name == "claim_generation":
        condition = f"{name} IS NULL OR {name} <> 0"
    else:
        condition = f"{name} IS NOT NULL"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {connection.ops.quote_name(column.table)} "
                       f"WHERE {condition})")
        return bool(cursor.fetchone()[0])


# --------------------------------------------------------------------------
# Indexes


def _identity_index_problems(connection: Any, table: str, column_name: str, applied: bool
                             ) -> list[Problem]:
    facts = catalog.column_facts(connection, table, column_name)
    if facts is None:
        return []  # reported (or not) with the column
    indexes = catalog.indexes_on(connection, table, column_name)
    problems = [_problem(table, index.name, rule, f"on {table}.{column_name}")
                for index in indexes for rule in index_rules(index, facts, connection.vendor)]
    if applied and not any(not index_rules(i, facts, connection.vendor) for i in indexes):
        problems.append(_problem(table, column_name, "index-missing"))
    return problems


def index_rules(index: IndexFacts, column_facts: ColumnFacts, vendor: str) -> list[str]:
    """Every rule ``index`` breaks as the exact full unique index of its identity column."""
    broken = []
    checks = (
        ("index-not-unique", not index.unique),
        ("index-partial", index.partial),
        ("index-expression", index.expression),
        ("index-multi-column", index.columns != 1),
        ("index-collation", index.collation is not None
         and index.collation != (column_facts.collation if vendor == "postgresql" else "BINARY")),
        ("index-opclass", not index.default_opclass),
        ("index-nulls-not-distinct", index.nulls_not_distinct),
        ("index-deferrable", index.deferrable),
        ("index-invalid", not index.valid),
    )
    for rule, failed in checks:
        if failed:
            broken.append(rule)
    return broken


def _helper_problems(connection: Any, applied: bool) -> list[Problem]:
    helpers = OWNED_HELPERS + (PG_OWNED_HELPERS if connection.vendor == "postgresql" else ())
    problems = []
    for table, name in helpers:
        taken = catalog.name_taken(connection, table, name)
        if applied and not taken:
            problems.append(_problem(table, name, "object-missing"))
        if not applied and taken:
            problems.append(_problem(table, name, "name-taken", "drop or rename it first"))
    if not applied:
        for table, column_name, name in UNIQUE_IDENTITIES:
            adoptable = {index.name for index in catalog.indexes_on(connection, table,
                                                                            column_name)}
            if name not in adoptable and catalog.name_taken(connection, table, name):
                problems.append(_problem(table, name, "name-taken", "drop or rename it first"))
    return problems

"""The owned-queue metadata: what migration 0003 adds, and how it is removed.

The columns are additive: format-1 readers ignore them, and every row keeps
being a valid format-1 row. Genuine old rows start with generation 0, no
token and no submission identity.

Adding is preceded by the admission checks (``schema.admission``) and
adopts what already exists in a compatible form. Removing is the controlled
downgrade: lock, then refuse while anything is still protected, then drop.
"""

from dataclasses import dataclass
from typing import Any

from django.core.management import call_command
from django.db import connections, transaction
from django.db.migrations.recorder import MigrationRecorder

from . import catalog
from ..errors import DowngradeRefused


@dataclass(frozen=True)
class OwnedColumn:
    table: str
    name: str
    kind: str  # "varchar", "bigint", "boolean", "integer", "timestamp"
    not_null_default: str | None = None  # SQL literal for NOT NULL DEFAULT columns

    def ddl(self, vendor: str) -> str:
        """The column definition, as ``ALTER TABLE … ADD COLUMN`` takes it on ``vendor``."""
        types = {
            "varchar": "varchar(255)",
            "bigint": "bigint",
            "boolean": "boolean" if vendor == "postgresql" else "bool",
            "integer": "integer",
            "timestamp": "timestamp with time zone" if vendor == "postgresql" else "datetime",
        }
        default = self.not_null_default
        if default is not None and vendor != "postgresql":
            default = {"false": "0", "true": "1"}.get(default, default)  # SQLite booleans
        suffix = " NULL" if default is None else f" NOT NULL DEFAULT {default}"
        return f'"{self.name}" {types[self.kind]}{suffix}'


#: Every column migration 0003 adds, in order.
OWNED_COLUMNS = (
    OwnedColumn("soniq_jobs", "claim_generation", "bigint", "0"),
    OwnedColumn("soniq_jobs", "claim_token", "varchar"),
    OwnedColumn("soniq_jobs", "claim_owner", "varchar"),
    OwnedColumn("soniq_jobs", "lease_expires_at", "timestamp"),
    OwnedColumn("soniq_jobs", "fence_required", "boolean", "false"),
    OwnedColumn("soniq_jobs", "cancel_requested", "boolean", "false"),
    OwnedColumn("soniq_jobs", "pid", "integer"),
    OwnedColumn("soniq_jobs", "active_key", "varchar"),
    OwnedColumn("soniq_jobs", "submission_id", "varchar"),
    OwnedColumn("soniq_jobs", "submission_fingerprint", "varchar"),
    OwnedColumn("soniq_dead_letter_jobs", "fence_required", "boolean", "false"),
    OwnedColumn("soniq_dead_letter_jobs", "submission_id", "varchar"),
    OwnedColumn("soniq_dead_letter_jobs", "submission_fingerprint", "varchar"),
)

#: (name, table, definition) of the indexes and constraints 0003 adds.
OWNED_INDEXES = (
    ("soniq_jobs_claim_token_key", "soniq_jobs", 'UNIQUE ("claim_token")'),
    ("soniq_jobs_submission_id_key", "soniq_jobs", 'UNIQUE ("submission_id")'),
    ("soniq_dlq_submission_id_key", "soniq_dead_letter_jobs", 'UNIQUE ("submission_id")'),
)

#: (table, column, name): each identity column needs one exact, full, unique index.
UNIQUE_IDENTITIES = tuple(
    (table, definition.removeprefix('UNIQUE ("').removesuffix('")'), name)
    for name, table, definition in OWNED_INDEXES
)

#: (table, name) of the other objects 0003 creates. These are never adopted:
#: one that already exists under the name refuses admission.
OWNED_HELPERS = (
    ("soniq_jobs", "soniq_jobs_active_key_live"),
    ("soniq_jobs", "soniq_jobs_lease_idx"),
)
PG_OWNED_HELPERS = (("soniq_jobs", "soniq_jobs_generation_not_negative"),)

#: The migration that adds the owned metadata, as Django records it.
OWNED_MIGRATION = ("soniq_django", "0003_owned_queue")

#: The tables that hold protected submissions; the downgrade locks both.
PROTECTED_TABLES = ("soniq_jobs", "soniq_dead_letter_jobs")


def owned_schema_applied(connection: Any) -> bool:
    """Whether Django records migration 0003 as applied on ``connection``."""
    recorder = MigrationRecorder(connection)
    return recorder.has_table() and OWNED_MIGRATION in recorder.applied_migrations()


# --------------------------------------------------------------------------
# Forwards


def add_owned_schema(connection: Any) -> None:
    """Add the owned columns, unique indexes, partial indexes and checks that are missing.

    A column or an identity index that already exists is adopted as it is:
    call this only after ``admit_owned_schema`` has judged it compatible.
    """
    vendor, quote = connection.vendor, connection.ops.quote_name
    with connection.cursor() as cursor:
        for column in OWNED_COLUMNS:
            if catalog.column_facts(connection, column.table, column.name) is None:
                cursor.execute(f"ALTER TABLE {quote(column.table)} ADD COLUMN {column.ddl(vendor)}")
        for table, column_name, name in UNIQUE_IDENTITIES:
            if catalog.indexes_on(connection, table, column_name):
                continue  # admitted, hence exact: adopt it under its own name
            if vendor == "postgresql":
                cursor.execute(f"ALTER TABLE {quote(table)} ADD CONSTRAINT {quote(name)} "
                               f"UNIQUE ({quote(column_name)})")
            else:
                cursor.execute(f"CREATE UNIQUE INDEX {quote(name)} ON {quote(table)} "
                               f"({quote(column_name)})")
        cursor.execute(
            'CREATE UNIQUE INDEX "soniq_jobs_active_key_live" ON "soniq_jobs" ("active_key") '
            "WHERE \"status\" IN ('queued', 'processing') AND \"active_key\" IS NOT NULL"
        )
        cursor.execute(
            'CREATE INDEX "soniq_jobs_lease_idx" ON "soniq_jobs" ("lease_expires_at") '
            "WHERE \"status\" = 'processing'"
        )
        if vendor == "postgresql":
            cursor.execute(
                'ALTER TABLE "soniq_jobs" ADD CONSTRAINT "soniq_jobs_generation_not_negative" '
                'CHECK ("claim_generation" >= 0)'
            )


def migrate_forward(apps: Any, schema_editor: Any) -> None:
    """Migration 0003 forwards: admit what exists, then add the owned metadata.

    Raises ``SchemaAdmissionError`` before any change when what exists is
    incompatible.
    """
    # Imported here: admission reads this module's column table.
    from .admission import admit_owned_schema

    admit_owned_schema(schema_editor.connection, applied=False)
    add_owned_schema(schema_editor.connection)


# --------------------------------------------------------------------------
# Backwards: the controlled downgrade


@dataclass(frozen=True)
class Retained:
    """What still stands in the way of a downgrade, as counts (never ids)."""

    protected_jobs: int
    protected_dead_letters: int
    active_claims: int
    #: Queued keyed jobs held back by their keys' limits (soniq_key_parked, migration
    #: 0029): below 0029 they would stay queued at 9999-01-01 and never run.
    held_back_keyed_jobs: int = 0

    def __bool__(self) -> bool:
        return bool(self.protected_jobs or self.protected_dead_letters or self.active_claims
                    or self.held_back_keyed_jobs)


def lock_owned_tables(connection: Any) -> None:
    """Keep every other writer out of the job tables until the transaction ends.

    Call inside a transaction. PostgreSQL: an ACCESS EXCLUSIVE table lock.
    SQLite: a write that changes nothing, which takes the database's write
    lock even when the transaction began deferred.
    """
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("LOCK TABLE soniq_jobs, soniq_dead_letter_jobs IN ACCESS EXCLUSIVE MODE")
        else:
            cursor.execute('UPDATE "soniq_jobs" SET "id" = "id" WHERE 0')


def retained_protection(connection: Any) -> Retained:
    """Count protected submissions (both tables) and live claims that hold a token."""
    with connection.cursor() as cursor:
        counts = []
        for table in PROTECTED_TABLES:
            cursor.execute(f'SELECT count(*) FROM "{table}" '
                           'WHERE "submission_id" IS NOT NULL OR "fence_required"')
            counts.append(cursor.fetchone()[0])
        # Owned claims of legacy rows count too: they hold a token, not a submission.
        cursor.execute('SELECT count(*) FROM "soniq_jobs" '
                       "WHERE \"status\" = 'processing' AND \"claim_token\" IS NOT NULL")
        counts.append(cursor.fetchone()[0])
    counts.append(held_back_keyed_jobs(connection))
    return Retained(*counts)


def held_back_keyed_jobs(connection: Any) -> int:
    """How many queued keyed jobs their keys hold back (0 before migration 0029)."""
    if "soniq_key_parked" not in connection.introspection.table_names():
        return 0
    with connection.cursor() as cursor:
        cursor.execute('SELECT count(*) FROM "soniq_key_parked" AS p JOIN "soniq_jobs" AS j '
                       "ON j.\"id\" = p.\"job_id\" WHERE j.\"status\" = 'queued'")
        found: int = cursor.fetchone()[0]
    return found


def refuse_held_back_keyed_jobs(apps: Any, schema_editor: Any) -> None:
    """Migration 0029 backwards, before anything is dropped: lock the job tables, then raise
    ``DowngradeRefused`` while keyed jobs are held back (their due times and their keys'
    turns live in the tables 0029 drops: they would stay parked at 9999-01-01 forever)."""
    connection = schema_editor.connection
    lock_owned_tables(connection)
    held = held_back_keyed_jobs(connection)
    if held:
        raise DowngradeRefused(Retained(0, 0, 0, held))


def lock_and_refuse_if_protected(connection: Any) -> None:
    """Lock the job tables, then raise ``DowngradeRefused`` if anything is protected."""
    lock_owned_tables(connection)  # first: a writer racing the check must finish before it
    retained = retained_protection(connection)
    if retained:
        raise DowngradeRefused(retained)


def controlled_downgrade(connection: Any) -> None:
    """Remove the owned metadata, leaving the format-1 schema; the reverse of 0003.

    Raises ``DowngradeRefused`` (and changes nothing) while a protected
    submission is retained or a claim with a token is active.
    """
    with transaction.atomic(using=connection.alias):
        lock_and_refuse_if_protected(connection)
        drop_owned_schema(connection)


def migrate_backward(apps: Any, schema_editor: Any) -> None:
    """Migration 0003 backwards: the controlled downgrade."""
    controlled_downgrade(schema_editor.connection)


def drop_owned_schema(connection: Any) -> None:
    """Drop every owned column that exists, with every index that uses one."""
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        for _table, name in OWNED_HELPERS:
            cursor.execute(f"DROP INDEX IF EXISTS {quote(name)}")
        for column in reversed(OWNED_COLUMNS):
            if catalog.column_facts(connection, column.table, column.name) is None:
                continue
            if connection.vendor != "postgresql":
                # SQLite refuses to drop an indexed column; PostgreSQL drops the
                # column's indexes and constraints with it.
                for index in catalog.indexes_on(connection, column.table, column.name):
                    cursor.execute(f"DROP INDEX IF EXISTS {quote(index.name)}")
            cursor.execute(f"ALTER TABLE {quote(column.table)} DROP COLUMN {quote(column.name)}")


def downgrade_to_format1(using: str = "default") -> bool:
    """Unapply migration 0003 (and whatever soniq migration sits above it) in one transaction.

    The lock is taken and the check made before any migration is reversed,
    and everything rolls back together on refusal. Returns False when 0003
    is not applied (nothing to do), True after the downgrade. Raises
    ``DowngradeRefused``.
    """
    connection = connections[using]
    if not owned_schema_applied(connection):
        return False
    # SQLite's schema editor needs foreign-key checks off, which SQLite only
    # allows outside a transaction.
    sqlite = connection.vendor == "sqlite"
    if sqlite:
        connection.disable_constraint_checking()
    try:
        with transaction.atomic(using=using):
            lock_and_refuse_if_protected(connection)
            call_command("migrate", OWNED_MIGRATION[0], "0002", database=using,
                         interactive=False, verbosity=0)
    finally:
        if sqlite:
            connection.enable_constraint_checking()
    return True

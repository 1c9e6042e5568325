"""The owned-queue metadata: what migration 0003 adds, and how it is removed.

The columns are additive: format-1 readers ignore them, and every row keeps
being a valid format-1 row. Genuine old rows start with generation 0, no
token and no submission identity.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class OwnedColumn:
    table: str
    name: str
    kind: str  # "varchar", "bigint", "boolean", "integer", "timestamp"
    not_null_default: str | None = None  # SQL literal for NOT NULL DEFAULT columns

    def ddl(self, vendor: str) -> str:
        types = {
            "varchar": "varchar(255)",
            "bigint": "bigint",
            "boolean": "boolean" if vendor == "postgresql" else "bool",
            "integer": "integer",
            "timestamp": "timestamp with time zone" if vendor == "postgresql" else "datetime",
        }
        suffix = " NULL" if self.not_null_default is None else (
            f" NOT NULL DEFAULT {self.not_null_default}"
        )
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


def _sqlite_bool(literal: str) -> str:
    return {"false": "0", "true": "1"}.get(literal, literal)


def add_owned_schema(connection) -> None:
    """Add the owned columns, unique indexes, partial indexes and checks."""
    vendor = connection.vendor
    with connection.cursor() as cursor:
        for column in OWNED_COLUMNS:
            ddl = column.ddl(vendor)
            if vendor != "postgresql" and column.not_null_default is not None:
                ddl = ddl.replace(
                    f"DEFAULT {column.not_null_default}",
                    f"DEFAULT {_sqlite_bool(column.not_null_default)}",
                )
            cursor.execute(f'ALTER TABLE "{column.table}" ADD COLUMN {ddl}')
        for name, table, definition in OWNED_INDEXES:
            if vendor == "postgresql":
                cursor.execute(f'ALTER TABLE "{table}" ADD CONSTRAINT "{name}" {definition}')
            else:
                columns = definition.removeprefix("UNIQUE ")
                cursor.execute(f'CREATE UNIQUE INDEX "{name}" ON "{table}" {columns}')
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


def migrate_forward(apps, schema_editor) -> None:
    """Migration 0003 forwards: add the owned metadata."""
    add_owned_schema(schema_editor.connection)


def migrate_backward(apps, schema_editor) -> None:
    """Migration 0003 backwards: remove the owned metadata."""
    drop_owned_schema(schema_editor.connection)


def drop_owned_schema(connection) -> None:
    """Drop every owned column and index, leaving the format-1 schema."""
    with connection.cursor() as cursor:
        for name in ("soniq_jobs_active_key_live", "soniq_jobs_lease_idx"):
            cursor.execute(f'DROP INDEX IF EXISTS "{name}"')
        if connection.vendor != "postgresql":
            for name, _table, _definition in OWNED_INDEXES:
                cursor.execute(f'DROP INDEX IF EXISTS "{name}"')
        for column in reversed(OWNED_COLUMNS):
            cursor.execute(f'ALTER TABLE "{column.table}" DROP COLUMN "{column.name}"')

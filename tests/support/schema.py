"""Shared helpers for the admission, downgrade and retirement tests.

Migration tests run with real transactions (``transaction=True``) and must
leave the database at the latest migration: ``at_latest_afterwards`` puts it
back, whatever state a test left it in.
"""

import uuid

from django.core.management import call_command
from django.db import connection, transaction
from django.db.migrations.recorder import MigrationRecorder

from soniq_django.schema import owned_metadata as owned_schema

JOB_TABLES = ("soniq_jobs", "soniq_dead_letter_jobs")


def execute(sql, params=None):
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def fetchall(sql, params=None):
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def open_fence_gate():
    """Let this transaction write protected rows past the PostgreSQL protection trigger."""
    if connection.vendor == "postgresql":
        execute("SELECT set_config('soniq.fenced_write', 'on', true)")


def applied_soniq_migrations():
    recorder = MigrationRecorder(connection)
    return sorted(name for app, name in recorder.applied_migrations() if app == "soniq_django")


def migrate(target=None):
    args = ["soniq_django"] + ([target] if target else [])
    call_command("migrate", *args, verbosity=0, interactive=False)


def insert_format1_job(status="queued", **columns):
    """Insert a job with format-1 columns only (works before and after 0003); returns its id."""
    job_id = uuid.uuid4()
    values = {"id": job_id.hex, "job_name": "tests.legacy", "status": status, **columns}
    names = ", ".join(f'"{name}"' for name in values)
    execute(f"INSERT INTO soniq_jobs ({names}) VALUES ({', '.join(['%s'] * len(values))})",
            list(values.values()))
    return job_id


def insert_format1_dead_letter(**columns):
    job_id = uuid.uuid4()
    values = {"id": job_id.hex, "job_name": "tests.legacy",
              "dead_letter_reason": "permanent_failure", **columns}
    names = ", ".join(f'"{name}"' for name in values)
    execute(f"INSERT INTO soniq_dead_letter_jobs ({names}) "
            f"VALUES ({', '.join(['%s'] * len(values))})", list(values.values()))
    return job_id


def schema_snapshot():
    """Everything about the soniq tables' definitions, and the migration record."""
    if connection.vendor == "postgresql":
        shape = fetchall(
            "SELECT 'column', table_name, column_name, data_type, is_nullable, column_default, "
            "collation_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name LIKE 'soniq%%' "
            "UNION ALL SELECT 'index', tablename, indexname, indexdef, '', '', '' FROM pg_indexes "
            "WHERE schemaname = current_schema() AND tablename LIKE 'soniq%%' "
            "UNION ALL SELECT 'constraint', conrelid::regclass::text, conname, "
            "pg_get_constraintdef(oid), '', '', '' FROM pg_constraint "
            "WHERE conrelid::regclass::text LIKE 'soniq%%' ORDER BY 1, 2, 3"
        )
    else:
        shape = fetchall("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY name")
        shape += fetchall("SELECT type, name, tbl_name, sql FROM sqlite_temp_master ORDER BY name")
    return shape, applied_soniq_migrations()


def rows_snapshot():
    return [fetchall(f'SELECT * FROM "{table}" ORDER BY "id"') for table in JOB_TABLES]


def index_names(table):
    """Names of every index on ``table`` (including those behind constraints)."""
    with connection.cursor() as cursor:
        return sorted(connection.introspection.get_constraints(cursor, table))


def assert_refused(error, table, name, rule):
    """``error`` (a SchemaAdmissionError) names ``rule`` for ``table``.``name``, in its text too."""
    assert any((p.table, p.name, p.rule) == (table, name, rule) for p in error.problems), \
        error.problems
    message = str(error)
    where = f"{table}.{name}" if name else table
    assert f"{where}:" in message and f"[rule {rule}]" in message, message


def restore_latest():
    """Empty the job tables and bring the schema back to the latest migration, cleanly."""
    if owned_schema.owned_schema_applied(connection):
        empty_job_tables()
        migrate("0002")
    else:
        clean_format1()
    if connection.vendor == "postgresql":
        execute("DROP COLLATION IF EXISTS ci")
    migrate()


def empty_job_tables():
    with transaction.atomic():
        open_fence_gate()
        for table in JOB_TABLES:
            execute(f'DELETE FROM "{table}"')


def clean_format1():
    """At 0002: empty the job tables and remove what a test made by hand.

    Its hand-made owned columns, helper and identity indexes, the hostile
    index and check constraint of the admission tests, and the ``ci``
    collation: the schema is 0002's again.
    """
    empty_job_tables()
    owned_schema.drop_owned_schema(connection)
    for table, name in owned_schema.OWNED_HELPERS:
        execute(f'DROP INDEX IF EXISTS "{name}"')
    for _table, _column, name in owned_schema.UNIQUE_IDENTITIES:
        execute(f'DROP INDEX IF EXISTS "{name}"')
    execute('DROP INDEX IF EXISTS "hostile_idx"')
    if connection.vendor == "postgresql":
        execute("ALTER TABLE soniq_jobs DROP CONSTRAINT IF EXISTS "
                "soniq_jobs_generation_not_negative")
        execute("DROP COLLATION IF EXISTS ci")

TSTZ = "timestamp with time zone"
NOW = "now"  # a timestamp default: now(), statement_timestamp() or CURRENT_TIMESTAMP


FORMAT_1 = {
    "soniq_jobs": {
        "id": ("uuid", False, None),
        "job_name": ("text", False, None),
        "args": ("jsonb", False, "'{}'::jsonb"),
        "args_hash": ("text", True, None),
        "status": ("text", False, "'queued'::text"),
        "attempts": ("integer", False, "0"),
        "max_attempts": ("integer", True, "4"),
        "queue": ("text", False, "'default'::text"),
        "priority": ("integer", False, "100"),
        "unique_job": ("boolean", False, "false"),
        "dedup_key": ("text", True, None),
        "scheduled_at": (TSTZ, True, None),
        "expires_at": (TSTZ, True, None),
        "last_error": ("text", True, None),
        "result": ("jsonb", True, None),
        "producer_id": ("text", True, None),
        "worker_id": ("uuid", True, None),
        "created_at": (TSTZ, False, NOW),
        "updated_at": (TSTZ, False, NOW),
    },
    "soniq_dead_letter_jobs": {
        "id": ("uuid", False, None),
        "job_name": ("text", False, None),
        "args": ("jsonb", False, "'{}'::jsonb"),
        "queue": ("text", False, "'default'::text"),
        "priority": ("integer", False, "100"),
        "max_attempts": ("integer", True, None),
        "attempts": ("integer", False, "0"),
        "last_error": ("text", True, None),
        "dead_letter_reason": ("text", False, None),
        "original_created_at": (TSTZ, True, None),
        "moved_to_dead_letter_at": (TSTZ, False, NOW),
        "resurrection_count": ("integer", False, "0"),
        "last_resurrection_at": (TSTZ, True, None),
        "tags": ("jsonb", True, None),
    },
    "soniq_recurring_jobs": {
        "id": ("uuid", False, None),
        "job_name": ("text", False, None),
        "schedule_type": ("text", False, None),
        "schedule_value": ("text", False, None),
        "job_kwargs": ("jsonb", False, "'{}'::jsonb"),
        "status": ("text", False, "'active'::text"),
        "queue": ("text", False, "'default'::text"),
        "priority": ("integer", False, "100"),
        "max_attempts": ("integer", True, "4"),
        "next_run": (TSTZ, True, None),
        "last_run": (TSTZ, True, None),
        "run_count": ("integer", False, "0"),
        "last_job_id": ("uuid", True, None),
    },
    # Not specified by the format: Soniq 0.1.0's own tables, column for column
    # (migration 0006; see docs/storage-format.md and docs/interop.md).
    "soniq_workers": {
        "id": ("uuid", False, None),
        "hostname": ("text", False, None),
        "pid": ("integer", False, None),
        "queues": ("ARRAY", True, "'{}'::text[]"),
        "concurrency": ("integer", False, "1"),
        "status": ("text", False, "'active'::text"),
        "last_heartbeat": (TSTZ, False, NOW),
        "started_at": (TSTZ, False, NOW),
        "version": ("text", True, None),
        "metadata": ("jsonb", True, "'{}'::jsonb"),
    },
    "soniq_task_registry": {
        "task_name": ("text", False, None),
        "worker_id": ("text", False, None),
        "last_seen_at": (TSTZ, False, None),
        "args_model_repr": ("text", True, None),
        # soniq_django's additions: NULL in the rows Soniq's workers write.
        "queue": ("text", True, None),
        "max_attempts": ("integer", True, None),
        "unique_job": ("boolean", True, None),
    },
}


def column_default(value):
    if value and value.lower() in ("now()", "statement_timestamp()", "current_timestamp"):
        return NOW
    return value

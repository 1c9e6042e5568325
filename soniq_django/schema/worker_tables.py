"""Migration 0006: soniq_workers and soniq_task_registry become Soniq's own tables.

Before 0006, soniq_django designed these two tables itself (format 1 leaves
them open). Soniq 0.1.0 has its own: workers keyed by ``(hostname, pid)``
with ``last_heartbeat`` and ``text[]`` queues, a registry keyed by (job
name, worker), and ``soniq_jobs.worker_id`` a foreign key to the workers.
A database shared with Soniq's workers needs Soniq's shape, so 0006 moves to
it, column for column.

On PostgreSQL the step is hand-written, because it meets two starting points:

- soniq_django's own tables (created by 0001): transformed in place. Worker
  rows keep their ids; ``running`` becomes ``active``, ``last_heartbeat_at``
  becomes ``last_heartbeat``, the JSON queue list becomes ``text[]`` and
  ``stopped_at`` goes (a stopped row's last heartbeat is when it stopped).
  Of several rows of one host and pid, the most recent stays. The registry
  is recreated empty: workers rewrite it whenever they start.
- Soniq's own tables (a database created by Soniq and adopted with
  ``migrate --fake-initial``): already in shape. Only what soniq_django adds
  is added: the registry's ``queue``, ``max_attempts`` and ``unique_job``
  columns (NULL in Soniq's rows) and any of Soniq's indexes that are missing.

On SQLite (no Soniq there) Django's own operations do the work.

The reverse restores soniq_django's 0001 tables, except on a database where
Soniq keeps its migration ledger (``soniq_migrations``: Soniq created the
database, or ``soniq setup`` ran on it). There the tables are Soniq's, and
Soniq's workers need them as they are, so the reverse only removes what
soniq_django added (the registry's three columns): unapplying the owned
migrations with ``soniq_downgrade`` hands a shared database back to Soniq
intact.
"""

from typing import Any

from django.db import migrations

from ..errors import TablesShapeError

WORKER_STATES = ("active", "stopping", "stopped")

#: (name, table, columns) of Soniq's non-unique indexes on the two tables.
#: Django allows an Index name of 30 characters at most, so these stay out
#: of the models and this migration creates them, under Soniq's names.
SONIQ_INDEXES = (
    ("idx_soniq_workers_last_heartbeat", "soniq_workers", "last_heartbeat"),
    ("idx_soniq_workers_status", "soniq_workers", "status"),
    ("idx_soniq_task_registry_task_name", "soniq_task_registry", "task_name"),
)

#: Columns soniq_django adds to Soniq's registry (NULL in rows Soniq writes).
REGISTRY_EXTRAS = (("queue", "text"), ("max_attempts", "integer"), ("unique_job", "boolean"))


def columns(connection: Any, table: str) -> set[str]:
    """The column names of ``table`` (empty when it does not exist)."""
    with connection.cursor() as cursor:
        if table not in connection.introspection.table_names(cursor):
            return set()
        return {column.name for column in
                connection.introspection.get_table_description(cursor, table)}


def shape(connection: Any) -> tuple[str, str]:
    """("soniq_django" | "soniq", "soniq_django" | "soniq"): whose design each table has now.

    soniq_workers first, then soniq_task_registry.
    """
    workers = columns(connection, "soniq_workers")
    registry = columns(connection, "soniq_task_registry")
    if "last_heartbeat_at" in workers:
        worker_shape = "soniq_django"
    elif {"last_heartbeat", "hostname", "pid"} <= workers:
        worker_shape = "soniq"
    else:
        raise TablesShapeError("soniq_workers is neither soniq_django's 0001 table nor Soniq's")
    if "job_name" in registry:
        registry_shape = "soniq_django"
    elif {"task_name", "worker_id", "last_seen_at"} <= registry:
        registry_shape = "soniq"
    else:
        raise TablesShapeError(
            "soniq_task_registry is neither soniq_django's 0001 table nor Soniq's")
    return worker_shape, registry_shape


# -- PostgreSQL --------------------------------------------------------------

_DETACH = """
    -- Rows about to be deleted stop being named by jobs, as Soniq's
    -- ON DELETE SET NULL foreign key would do. The gate lets the write
    -- through the protection trigger of 0004 (worker_id is not fenced).
    SELECT pg_catalog.set_config('soniq.fenced_write', 'on', true);
    UPDATE soniq_jobs AS j SET worker_id = NULL
     WHERE j.worker_id IN (SELECT w.id FROM soniq_workers AS w WHERE {condition});
    SELECT pg_catalog.set_config('soniq.fenced_write', 'off', true);
    DELETE FROM soniq_workers AS w WHERE {condition};
"""

_OLDER_OF_A_PROCESS = """
    EXISTS (SELECT 1 FROM soniq_workers AS n
             WHERE n.hostname = w.hostname AND n.pid = w.pid
               AND (n.{heartbeat}, n.started_at, n.id) > (w.{heartbeat}, w.started_at, w.id))
"""

_WORKERS_FORWARD = _DETACH.format(
    condition=_OLDER_OF_A_PROCESS.format(heartbeat="last_heartbeat_at")) + """
    ALTER TABLE soniq_workers RENAME COLUMN last_heartbeat_at TO last_heartbeat;
    ALTER TABLE soniq_workers DROP COLUMN stopped_at;
    -- A subquery cannot convert a column in place: go through a new one.
    ALTER TABLE soniq_workers ADD COLUMN queues_text text[];
    UPDATE soniq_workers SET queues_text = CASE
        WHEN queues IS NULL OR pg_catalog.jsonb_typeof(queues) <> 'array' THEN '{}'::text[]
        ELSE ARRAY(SELECT pg_catalog.jsonb_array_elements_text(queues)) END;
    ALTER TABLE soniq_workers DROP COLUMN queues;
    ALTER TABLE soniq_workers RENAME COLUMN queues_text TO queues;
    ALTER TABLE soniq_workers ALTER COLUMN queues SET DEFAULT '{}';
    UPDATE soniq_workers SET status = 'active' WHERE status = 'running';
    UPDATE soniq_workers SET status = 'stopped' WHERE status NOT IN ('active', 'stopping');
    ALTER TABLE soniq_workers ALTER COLUMN status SET DEFAULT 'active';
    ALTER TABLE soniq_workers ADD COLUMN version text;
    ALTER TABLE soniq_workers ADD COLUMN metadata jsonb DEFAULT '{}';
    ALTER TABLE soniq_workers ADD CONSTRAINT soniq_workers_status_check
        CHECK (status IN ('active', 'stopping', 'stopped'));
    CREATE UNIQUE INDEX idx_soniq_workers_host_pid ON soniq_workers (hostname, pid);
"""

_WORKERS_BACKWARD = """
    DROP INDEX idx_soniq_workers_host_pid;
    DROP INDEX IF EXISTS idx_soniq_workers_last_heartbeat;
    DROP INDEX IF EXISTS idx_soniq_workers_status;
    ALTER TABLE soniq_workers DROP CONSTRAINT soniq_workers_status_check;
    ALTER TABLE soniq_workers DROP COLUMN version;
    ALTER TABLE soniq_workers DROP COLUMN metadata;
    UPDATE soniq_workers SET status = 'running' WHERE status = 'active';
    ALTER TABLE soniq_workers ALTER COLUMN status SET DEFAULT 'running';
    ALTER TABLE soniq_workers ADD COLUMN queues_json jsonb;
    UPDATE soniq_workers SET queues_json = CASE
        WHEN queues IS NULL OR pg_catalog.cardinality(queues) = 0 THEN NULL
        ELSE pg_catalog.to_jsonb(queues) END;
    ALTER TABLE soniq_workers DROP COLUMN queues;
    ALTER TABLE soniq_workers RENAME COLUMN queues_json TO queues;
    ALTER TABLE soniq_workers ADD COLUMN stopped_at timestamp with time zone;
    UPDATE soniq_workers SET stopped_at = last_heartbeat WHERE status = 'stopped';
    ALTER TABLE soniq_workers RENAME COLUMN last_heartbeat TO last_heartbeat_at;
"""

_REGISTRY_CREATE = """
    CREATE TABLE soniq_task_registry (
        task_name text NOT NULL,
        worker_id text NOT NULL,
        last_seen_at timestamp with time zone NOT NULL,
        args_model_repr text,
        queue text,
        max_attempts integer,
        unique_job boolean,
        PRIMARY KEY (task_name, worker_id)
    );
"""

_REGISTRY_OLD = """
    CREATE TABLE soniq_task_registry (
        job_name text NOT NULL PRIMARY KEY,
        queue text NOT NULL DEFAULT 'default',
        max_attempts integer NULL,
        unique_job boolean NOT NULL DEFAULT false,
        args_model_repr text NULL,
        updated_at timestamp with time zone NOT NULL DEFAULT now()
    );
"""


def _indexes_sql() -> str:
    return "".join(f"CREATE INDEX IF NOT EXISTS {name} ON {table} ({column});\n"
                   for name, table, column in SONIQ_INDEXES)


def postgresql_forward(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    worker_shape, registry_shape = shape(connection)
    with connection.cursor() as cursor:
        if worker_shape == "soniq_django":
            cursor.execute(_WORKERS_FORWARD)
        if registry_shape == "soniq_django":
            cursor.execute("DROP TABLE soniq_task_registry;" + _REGISTRY_CREATE)
        else:
            cursor.execute("".join(
                f"ALTER TABLE soniq_task_registry ADD COLUMN IF NOT EXISTS {name} {kind};\n"
                for name, kind in REGISTRY_EXTRAS))
        cursor.execute(_indexes_sql())


def soniq_owns_the_tables(connection: Any) -> bool:
    """Whether Soniq's own migration ledger is in this database (its tables are Soniq's)."""
    with connection.cursor() as cursor:
        return "soniq_migrations" in connection.introspection.table_names(cursor)


def postgresql_backward(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        if soniq_owns_the_tables(connection):
            cursor.execute("".join(
                f"ALTER TABLE soniq_task_registry DROP COLUMN IF EXISTS {name};\n"
                for name, _kind in REGISTRY_EXTRAS))
            return
        cursor.execute(_WORKERS_BACKWARD)
        cursor.execute("DROP TABLE soniq_task_registry;" + _REGISTRY_OLD)


# -- SQLite: data steps around Django's own operations ----------------------

def sqlite_before(apps: Any, schema_editor: Any) -> None:
    """Keep one row per process (the latest) and use Soniq's state names."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "UPDATE soniq_jobs SET worker_id = NULL WHERE worker_id IN "
            "(SELECT w.id FROM soniq_workers AS w WHERE"
            + _OLDER_OF_A_PROCESS.format(heartbeat="last_heartbeat_at") + ")")
        cursor.execute("DELETE FROM soniq_workers AS w WHERE"
                       + _OLDER_OF_A_PROCESS.format(heartbeat="last_heartbeat_at"))
        cursor.execute("UPDATE soniq_workers SET status = 'active' WHERE status = 'running'")


def sqlite_after_backward(apps: Any, schema_editor: Any) -> None:
    """Back to soniq_django's 0001 words: ``running``; ``stopped_at`` from the last heartbeat."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("UPDATE soniq_workers SET status = 'running' WHERE status = 'active'")
        cursor.execute("UPDATE soniq_workers SET stopped_at = last_heartbeat_at "
                       "WHERE status = 'stopped'")


def create_soniq_indexes(apps: Any, schema_editor: Any) -> None:
    with schema_editor.connection.cursor() as cursor:
        for name, table, column in SONIQ_INDEXES:
            cursor.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {table} ({column})")


def drop_soniq_indexes(apps: Any, schema_editor: Any) -> None:
    with schema_editor.connection.cursor() as cursor:
        for name, _table, _column in SONIQ_INDEXES:
            cursor.execute(f"DROP INDEX IF EXISTS {name}")


# -- the operation -------------------------------------------------------------

class ForVendors(migrations.SeparateDatabaseAndState):
    """``operations`` change the state everywhere and the database on every vendor but
    PostgreSQL, where ``postgresql`` runs instead."""

    def __init__(self, operations: list[Any], postgresql: list[Any]) -> None:
        super().__init__(database_operations=operations, state_operations=operations)
        self.postgresql = postgresql

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return (self.__class__.__qualname__, [],
                {"operations": self.state_operations, "postgresql": self.postgresql})

    def describe(self) -> str:
        return "Soniq's own soniq_workers and soniq_task_registry"

    def _database_operations(self, connection: Any) -> list[Any]:
        chosen: list[Any] = (self.postgresql if connection.vendor == "postgresql"
                             else self.state_operations)
        return chosen

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any,
                          to_state: Any) -> None:
        for operation in self._database_operations(schema_editor.connection):
            to_state = from_state.clone()
            operation.state_forwards(app_label, to_state)
            operation.database_forwards(app_label, schema_editor, from_state, to_state)
            from_state = to_state

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any,
                           to_state: Any) -> None:
        operations = self._database_operations(schema_editor.connection)
        to_states = {}
        for operation in operations:
            to_states[operation] = to_state
            to_state = to_state.clone()
            operation.state_forwards(app_label, to_state)
        for operation in reversed(operations):
            from_state = to_state
            to_state = to_states[operation]
            operation.database_backwards(app_label, schema_editor, from_state, to_state)

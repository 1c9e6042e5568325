"""The format-1 tables, read back from the database and compared with the format."""

import re

import pytest
from django.db import connection

from soniq_django import get_job
from tests.support.schema import FORMAT_1, TSTZ, column_default


# column: (PostgreSQL type, nullable, default) — written from the storage format.


# Added by migration 0003 (owned queue); not part of format 1, never required
# by format-1 readers or writers.
OWNED = {
    "soniq_jobs": {
        "claim_generation": ("bigint", False, "0"),
        "claim_token": ("character varying", True, None),
        "claim_owner": ("character varying", True, None),
        "lease_expires_at": (TSTZ, True, None),
        "fence_required": ("boolean", False, "false"),
        "cancel_requested": ("boolean", False, "false"),
        "pid": ("integer", True, None),
        "active_key": ("character varying", True, None),
        "submission_id": ("character varying", True, None),
        "submission_fingerprint": ("character varying", True, None),
    },
    "soniq_dead_letter_jobs": {
        "fence_required": ("boolean", False, "false"),
        "submission_id": ("character varying", True, None),
        "submission_fingerprint": ("character varying", True, None),
    },
}


#: Added by 0020_attempts: when the current or last attempt was claimed.
ATTEMPTS = {"soniq_jobs": {"claimed_at": (TSTZ, True, None)}}

#: Added by 0025_workflows: whether another job waits for this one.
WORKFLOWS = {"soniq_jobs": {"has_dependents": ("boolean", True, None)}}

#: Added by 0029_keys: the key of a job limited per key; by 0032_key_park: its dead letter's.
KEYS = {"soniq_jobs": {"concurrency_key": ("text", True, None)},
        "soniq_dead_letter_jobs": {"concurrency_key": ("text", True, None)}}


def _expected(table):
    return {**FORMAT_1[table], **OWNED.get(table, {}), **ATTEMPTS.get(table, {}),
            **WORKFLOWS.get(table, {}), **KEYS.get(table, {})}


@pytest.mark.postgresql_only
@pytest.mark.django_db
@pytest.mark.parametrize("table", sorted(FORMAT_1))
def test_postgresql_columns_match_the_format(table):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT column_name, data_type, is_nullable, column_default "
            "FROM information_schema.columns WHERE table_name = %s AND table_schema = current_schema()",
            [table],
        )
        found = {name: (kind, nullable == "YES", column_default(default))
                 for name, kind, nullable, default in cursor.fetchall()}
    assert found == _expected(table)


@pytest.mark.django_db
@pytest.mark.parametrize("table", sorted(FORMAT_1))
def test_column_names_and_nullability_on_every_backend(table):
    with connection.cursor() as cursor:
        description = connection.introspection.get_table_description(cursor, table)
    found = {column.name: column.null_ok for column in description}
    assert found == {name: spec[1] for name, spec in _expected(table).items()}


@pytest.mark.postgresql_only
@pytest.mark.django_db
def test_the_formats_raw_insert_works_and_reads_back():
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO soniq_jobs (id, job_name, args, status, queue, max_attempts) "
            "VALUES (gen_random_uuid(), 'billing.send_invoice', '{\"order_id\": 123}', "
            "'queued', 'default', 4) RETURNING id"
        )
        (job_id,) = cursor.fetchone()
        cursor.execute(
            "INSERT INTO soniq_recurring_jobs (id, job_name, schedule_type, schedule_value, "
            "job_kwargs) VALUES (gen_random_uuid(), 'reports.daily', 'cron', '0 9 * * *', '{}')"
        )
        cursor.execute(
            "SELECT status, run_count, queue, max_attempts FROM soniq_recurring_jobs"
        )
        assert cursor.fetchone() == ("active", 0, "default", 4)
    info = get_job(job_id)
    assert (info.status, info.attempts, info.max_attempts) == ("queued", 0, 4)
    with connection.cursor() as cursor:
        cursor.execute("SELECT priority, unique_job FROM soniq_jobs WHERE id = %s", [job_id])
        assert cursor.fetchone() == (100, False)


@pytest.mark.django_db
def test_partial_unique_index_stops_a_second_queued_copy():
    from django.db import IntegrityError, transaction

    from soniq_django.models import Job

    Job.objects.create(job_name="a.b", args_hash="h", unique_job=True)
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.create(job_name="a.b", args_hash="h", unique_job=True)
    Job.objects.create(job_name="a.b", args_hash="h", unique_job=True, status="done")


NEXT_ELIGIBLE = (
    "SELECT id FROM soniq_jobs WHERE status = 'queued' AND queue = 'default' "
    "AND (scheduled_at IS NULL OR scheduled_at <= {now}) "
    "ORDER BY priority, created_at LIMIT 1"
)


@pytest.mark.django_db
def test_next_eligible_job_is_an_index_scan():
    """With many finished rows and a few queued ones, the planner reads the claim index."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "INSERT INTO soniq_jobs (id, job_name, status) "
                "SELECT gen_random_uuid(), 'a.b', CASE WHEN n % 1000 = 0 THEN 'queued' ELSE 'done' END "
                "FROM generate_series(1, 20000) AS n"
            )
            cursor.execute("ANALYZE soniq_jobs")
            cursor.execute("EXPLAIN " + NEXT_ELIGIBLE.format(now="now()"))
        else:
            cursor.execute(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000) "
                "INSERT INTO soniq_jobs (id, job_name, status) "
                "SELECT lower(hex(randomblob(16))), 'a.b', "
                "CASE WHEN i % 1000 = 0 THEN 'queued' ELSE 'done' END FROM n"
            )
            cursor.execute("ANALYZE")
            cursor.execute("EXPLAIN QUERY PLAN " + NEXT_ELIGIBLE.format(now="CURRENT_TIMESTAMP"))
        plan = "\n".join(str(row) for row in cursor.fetchall())
    # A claim index serves it (per queue, or across queues; decision 0018).
    assert any(f"soniq_jobs_claim_{kind}idx" in plan for kind in ("", "now_", "scheduled_")), plan
    assert "Seq Scan" not in plan and "SCAN soniq_jobs\n" not in plan + "\n", plan


# Soniq 0.1.0's keys, checks and indexes on the two tables it shares with
# soniq_django, as pg_indexes / pg_constraint print them (migration 0006).
SONIQ_WORKER_TABLE_INDEXES = {
    "soniq_workers_pkey": "UNIQUE INDEX soniq_workers_pkey ON soniq_workers USING btree (id)",
    "idx_soniq_workers_host_pid":
        "UNIQUE INDEX idx_soniq_workers_host_pid ON soniq_workers USING btree (hostname, pid)",
    "idx_soniq_workers_last_heartbeat":
        "INDEX idx_soniq_workers_last_heartbeat ON soniq_workers USING btree (last_heartbeat)",
    "idx_soniq_workers_status":
        "INDEX idx_soniq_workers_status ON soniq_workers USING btree (status)",
    "soniq_task_registry_pkey": "UNIQUE INDEX soniq_task_registry_pkey ON soniq_task_registry "
                                "USING btree (task_name, worker_id)",
    "idx_soniq_task_registry_task_name": "INDEX idx_soniq_task_registry_task_name ON "
                                         "soniq_task_registry USING btree (task_name)",
}


@pytest.mark.postgresql_only
@pytest.mark.django_db
def test_the_worker_tables_have_soniqs_keys_checks_and_indexes():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() "
            "AND tablename IN ('soniq_workers', 'soniq_task_registry')")
        found = {name: re.sub(r" ON \w+\.", " ON ", definition.removeprefix("CREATE "))
                 for name, definition in cursor.fetchall()}
        cursor.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = 'soniq_workers'::regclass AND contype = 'c'")
        checks = dict(cursor.fetchall())
        cursor.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
                       "WHERE attrelid = 'soniq_workers'::regclass AND attname = 'queues'")
        (queues_type,) = cursor.fetchone()
    assert found == SONIQ_WORKER_TABLE_INDEXES
    assert checks == {"soniq_workers_status_check":
                      "CHECK ((status = ANY (ARRAY['active'::text, 'stopping'::text, "
                      "'stopped'::text])))"}
    assert queues_type == "text[]"


@pytest.mark.django_db
def test_a_queue_list_round_trips_on_every_backend():
    from soniq_django.models import Worker

    for pid, queues in enumerate((["mail", "reports"], [], None, ["é", "a,b", "{x}", '"q"'])):
        Worker.objects.create(hostname="h", pid=pid, queues=queues)
        assert Worker.objects.get(pid=pid).queues == queues
    if connection.vendor == "postgresql":  # a real array, as Soniq's worker reads it
        with connection.cursor() as cursor:
            cursor.execute("SELECT queues[2], cardinality(queues) FROM soniq_workers WHERE pid = 3")
            assert cursor.fetchone() == ("a,b", 4)

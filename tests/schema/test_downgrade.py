"""Controlled downgrade: lock, refuse while anything is protected, else back to clean format 1."""

import sqlite3
import threading
import time
import uuid
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections, transaction

from soniq_django.models import DeadLetterJob, Job
from soniq_django.schema.owned_metadata import (
    OWNED_COLUMNS, OWNED_HELPERS, PG_OWNED_HELPERS, UNIQUE_IDENTITIES, DowngradeRefused,
    controlled_downgrade, lock_owned_tables, owned_schema_applied,
)
from soniq_django.errors import ErrorCode
from tests.support.schema import (
    FORMAT_1, applied_soniq_migrations, column_default, fetchall, index_names,
    insert_format1_dead_letter, insert_format1_job, open_fence_gate, rows_snapshot,
    schema_snapshot,
)

PG = settings.BACKEND == "postgresql"
OWNED_NAMES = {column.name for column in OWNED_COLUMNS}
MODELS = {"soniq_jobs": Job, "soniq_dead_letter_jobs": DeadLetterJob}

OWNED_OBJECTS = ({name for _t, _c, name in UNIQUE_IDENTITIES}
                 | {name for _t, name in OWNED_HELPERS + PG_OWNED_HELPERS})


#: Migration 0014 (claim protocol v6) put these in the place of format 1's claim_any index.
V6_CLAIM_INDEXES = {"soniq_jobs_claim_now_idx", "soniq_jobs_claim_scheduled_idx",
                    "soniq_jobs_claim_due_idx"}


#: Claim protocol v8's index (migration 0018): never part of format 1.
V8_CLAIM_INDEXES = {"soniq_jobs_claim_queue_now_idx"}

#: The admin's newest-first index (migration 0022): never part of format 1.
ADMIN_INDEXES = {"soniq_jobs_created_idx"}


def format1_objects(model):
    """The index and constraint names ``model`` declares, less those migration 0003 owns,
    and as format 1 had them before 0014."""
    declared = {index.name for index in model._meta.indexes}
    declared |= {constraint.name for constraint in model._meta.constraints}
    if declared & V6_CLAIM_INDEXES:
        declared = declared - V6_CLAIM_INDEXES | {"soniq_jobs_claim_any_idx"}
    return declared - OWNED_OBJECTS - V8_CLAIM_INDEXES - ADMIN_INDEXES


def downgrade():
    out = StringIO()
    call_command("soniq_downgrade", stdout=out)
    return out.getvalue()


def insert_owned_job(**columns):
    """A job row written the way the owned source writes it (past the protection trigger)."""
    with transaction.atomic():
        open_fence_gate()
        return insert_format1_job(**columns)


def test_downgrade_leaves_a_clean_format_1_schema(at_latest_afterwards):
    kept = insert_format1_job(status="done")
    insert_owned_job(status="done", claim_token="finished-claim", claim_generation=3)
    insert_format1_job(status="processing")  # a legacy claim: no token

    assert downgrade() == "downgraded to format 1\n"

    assert applied_soniq_migrations()[-1].startswith("0002")  # 0003 and above unapplied
    for table in ("soniq_jobs", "soniq_dead_letter_jobs"):
        with connection.cursor() as cursor:
            names = {c.name for c in connection.introspection.get_table_description(cursor, table)}
        assert names == set(FORMAT_1[table])
        # Named objects only: SQLite's primary key and JSON checks have no name.
        found = {name for name in index_names(table) if not name.startswith("__")}
        assert found == format1_objects(MODELS[table]) | ({f"{table}_pkey"} if PG else set())
        assert not any(OWNED_NAMES & set(_index_columns(table, name)) for name in found)
    assert fetchall("SELECT count(*) FROM soniq_jobs WHERE id = %s", [kept.hex]) == [(1,)]
    assert downgrade() == "already format 1: nothing to do\n"


def _index_columns(table, name):
    with connection.cursor() as cursor:
        return connection.introspection.get_constraints(cursor, table)[name]["columns"] or []


@pytest.mark.postgresql_only
def test_downgraded_postgresql_columns_equal_the_format(at_latest_afterwards):
    downgrade()
    for table in ("soniq_jobs", "soniq_dead_letter_jobs"):
        rows = fetchall(
            "SELECT column_name, data_type, is_nullable, column_default FROM "
            "information_schema.columns WHERE table_name = %s AND table_schema = current_schema()",
            [table])
        found = {name: (kind, nullable == "YES", column_default(default))
                 for name, kind, nullable, default in rows}
        assert found == FORMAT_1[table]
    assert fetchall("SELECT count(*) FROM pg_trigger WHERE tgrelid = 'soniq_jobs'::regclass "
                    "AND NOT tgisinternal") == [(0,)]


REFUSALS = {
    "protected-job": lambda: insert_owned_job(
        status="done", submission_id="sub-secret-1", submission_fingerprint="v1:abc",
        fence_required=True),
    "fenced-legacy-claim": lambda: insert_owned_job(status="queued", fence_required=True),
    "protected-dead-letter": lambda: insert_format1_dead_letter(
        submission_id="sub-secret-1", fence_required=True),
    "active-owned-claim": lambda: insert_owned_job(
        status="processing", claim_token="tok-secret-1", claim_owner="w1", claim_generation=1),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_downgrade_refuses_while_anything_is_protected(at_latest_afterwards, case):
    job_id = REFUSALS[case]()
    before, rows = schema_snapshot(), rows_snapshot()

    with pytest.raises(CommandError) as refused:
        downgrade()

    message = str(refused.value)
    assert "downgrade refused" in message
    for secret in ("sub-secret-1", "tok-secret-1", "v1:abc", str(job_id), job_id.hex):
        assert secret not in message
    # Nothing changed: not the schema, not the migration record (0004 either), not a row.
    assert schema_snapshot() == before
    assert rows_snapshot() == rows


def test_the_migration_reverse_refuses_too(at_latest_afterwards):
    insert_owned_job(status="cancelled", submission_id="sub-secret-1", fence_required=True)
    with pytest.raises(DowngradeRefused) as refused:
        call_command("migrate", "soniq_django", "0002", verbosity=0)
    assert refused.value.code == ErrorCode.QUEUE_SUBMISSION_CONFLICT
    assert refused.value.retained.protected_jobs == 1
    assert "0003_owned_queue" in applied_soniq_migrations()
    # 0004's reverse refuses first too, so the protection trigger survives.
    assert "0004_claim_protocol" in applied_soniq_migrations()
    assert owned_schema_applied(connection)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_trigger WHERE tgname = 'soniq_protect_owned'")
            assert cursor.fetchone() == (1,)


def test_retiring_then_downgrading_succeeds(at_latest_afterwards):
    insert_owned_job(status="done", submission_id="sub-1", fence_required=True,
                     updated_at="2000-01-01 00:00:00+00:00" if PG else "2000-01-01 00:00:00")
    with pytest.raises(CommandError):
        downgrade()
    call_command("soniq_retire_submissions", "--older-than", "1", "--confirm", stdout=StringIO())
    assert downgrade() == "downgraded to format 1\n"


# --------------------------------------------------------------------------
# Lock first, then check


def _other_connection():
    """A second, independent connection to the test database, in a transaction."""
    if PG:
        raw = connection.get_new_connection(connection.get_connection_params())
        raw.autocommit = False
        return raw
    raw = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None, timeout=20)
    raw.execute("BEGIN IMMEDIATE")
    return raw


def _downgrade_in_thread(entry, outcome):
    try:
        outcome["output"] = entry()
    except Exception as error:  # noqa: BLE001 - handed to the test thread
        outcome["error"] = error
    finally:
        connections.close_all()


def _wait_until_downgrade_waits(thread):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if PG:
            waiting = fetchall("SELECT count(*) FROM pg_locks WHERE NOT granted "
                               "AND relation = 'soniq_jobs'::regclass")[0][0]
            if waiting:
                return
        elif thread.is_alive() and time.monotonic() > deadline - 9:
            return  # SQLite shows no lock table; a second blocked is the witness
        time.sleep(0.05)
    pytest.fail("the downgrade did not wait for the concurrent writer")


# The command checks under its own lock, and the migration reverse checks again:
# each entry point must take the lock before it looks.
ENTRY_POINTS = {
    "command": downgrade,
    "migration-reverse": lambda: controlled_downgrade(connection),
}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_downgrade_waits_for_a_concurrent_protected_insert_then_refuses(
        at_latest_afterwards, entry):
    other = _other_connection()
    cursor = other.cursor()
    if PG:
        cursor.execute("SELECT set_config('soniq.fenced_write', 'on', true)")
    placeholder = "%s" if PG else "?"
    cursor.execute("INSERT INTO soniq_jobs (id, job_name, status, submission_id, fence_required) "
                   f"VALUES ({placeholder}, 'tests.racing', 'queued', 'sub-racing', true)",
                   [uuid.uuid4().hex])
    outcome = {}
    thread = threading.Thread(target=_downgrade_in_thread, args=(ENTRY_POINTS[entry], outcome))
    thread.start()
    try:
        _wait_until_downgrade_waits(thread)
        assert thread.is_alive() and not outcome  # still waiting for the writer
    finally:
        other.commit()  # the protected row becomes visible only now
        other.close()
    thread.join(30)

    assert not thread.is_alive()
    assert isinstance(outcome.get("error"), (CommandError, DowngradeRefused)), outcome
    assert "downgrade refused" in str(outcome["error"])
    assert owned_schema_applied(connection)
    assert fetchall("SELECT count(*) FROM soniq_jobs WHERE submission_id = 'sub-racing'") == [(1,)]


@pytest.mark.sqlite_only  # SQLite's write lock; PostgreSQL's LOCK TABLE is shown above
def test_sqlite_lock_holds_the_write_lock_even_in_a_deferred_transaction(at_latest_afterwards):
    connection.ensure_connection()
    connection.transaction_mode = None  # BEGIN DEFERRED, as a default SQLite setting has it
    other = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None, timeout=0)
    try:
        with transaction.atomic():
            lock_owned_tables(connection)
            # A plain read lock would still let another writer reserve the database.
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("BEGIN IMMEDIATE")
    finally:
        other.close()
        connection.close()  # back to the configured transaction mode

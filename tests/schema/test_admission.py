"""Admission checks of migration 0003: what already exists is judged before anything changes."""

from io import StringIO
from types import SimpleNamespace

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction

from soniq_django.schema import admission, catalog as schema_catalog, owned_metadata as owned_schema
from soniq_django.schema.admission import SchemaAdmissionError, admit_owned_schema, check_owned_schema
from tests.support.ci import unavailable
from tests.support.schema import (
    applied_soniq_migrations, assert_refused, execute, fetchall, insert_format1_dead_letter,
    insert_format1_job, migrate, rows_snapshot, schema_snapshot,
)

PG = settings.BACKEND == "postgresql"
sqlite_only = pytest.mark.sqlite_only  # SQLite's collation probe; PostgreSQL has none

ADD = "ALTER TABLE soniq_jobs ADD COLUMN "
ADD_DLQ = "ALTER TABLE soniq_dead_letter_jobs ADD COLUMN "
TOKEN = ADD + "claim_token varchar(255) NULL"


def test_every_problem_is_listed_at_once(at_format1):
    execute(ADD + "claim_token char(255) NULL")
    execute(ADD + "claim_generation bigint NOT NULL DEFAULT 7")
    with pytest.raises(SchemaAdmissionError) as refused:
        admit_owned_schema(connection)
    rules = {(p.name, p.rule) for p in refused.value.problems}
    assert ("claim_token", "varchar-required") in rules
    assert ("claim_generation", "generation-default") in rules
    assert isinstance(refused.value, ImproperlyConfigured)


def test_a_legacy_value_in_a_pre_existing_column_is_refused(at_format1):
    execute(ADD + "submission_id varchar(255) NULL")
    insert_format1_job(status="done", submission_id="made-by-another-tool")
    with pytest.raises(SchemaAdmissionError) as refused:
        migrate()
    assert_refused(refused.value, "soniq_jobs", "submission_id", "legacy-values")
    assert "made-by-another-tool" not in str(refused.value)


def test_admission_runs_before_any_ddl(at_format1, monkeypatch):
    calls = []
    editor = SimpleNamespace(connection=connection)
    # A context, not the fixture: the teardown migration needs the real function.
    with monkeypatch.context() as patch:
        patch.setattr(owned_schema, "add_owned_schema", lambda conn: calls.append(conn))

        owned_schema.migrate_forward(None, editor)  # a clean database: admitted, then added
        assert calls == [connection]

        execute(ADD + "claim_token character(255) NULL")
        with pytest.raises(SchemaAdmissionError):
            owned_schema.migrate_forward(None, editor)
        assert calls == [connection]  # refused before add_owned_schema was reached


# PostgreSQL spells a default as the catalog keeps it; SQLite as it was written.
COMPATIBLE_PG = [
    ADD + "claim_generation bigint NOT NULL DEFAULT '0'::bigint",
    ADD + "fence_required boolean NOT NULL DEFAULT 'false'::boolean",
    ADD + "cancel_requested boolean NOT NULL DEFAULT false",
    TOKEN, "CREATE UNIQUE INDEX adopted_token_key ON soniq_jobs (claim_token)",
    ADD + "submission_id character varying NULL",
    "ALTER TABLE soniq_jobs ADD CONSTRAINT adopted_submission_key UNIQUE (submission_id)",
    ADD + 'claim_owner varchar(255) COLLATE "C" NULL',
    ADD_DLQ + "fence_required boolean NOT NULL DEFAULT 'f'",
]
COMPATIBLE_SQLITE = [
    ADD + "claim_generation bigint NOT NULL DEFAULT '0'",
    ADD + "fence_required bool NOT NULL DEFAULT '0'",
    ADD + "cancel_requested boolean NOT NULL DEFAULT false",
    TOKEN, "CREATE UNIQUE INDEX adopted_token_key ON soniq_jobs (claim_token)",
    ADD + "submission_id VARCHAR(255) COLLATE BINARY",
    "CREATE UNIQUE INDEX adopted_submission_key ON soniq_jobs (submission_id COLLATE BINARY)",
    ADD_DLQ + "fence_required bool NOT NULL DEFAULT 0",
]


def test_compatible_pre_existing_columns_and_indexes_are_adopted(at_format1):
    insert_format1_job(status="done")
    for statement in COMPATIBLE_PG if PG else COMPATIBLE_SQLITE:
        execute(statement)
    assert check_owned_schema(connection, applied=False) == []

    migrate()

    assert check_owned_schema(connection) == []
    with connection.cursor() as cursor:
        unique = connection.introspection.get_constraints(cursor, "soniq_jobs")
    for column, adopted in (("claim_token", "adopted_token_key"),
                            ("submission_id", "adopted_submission_key")):
        on_column = [n for n, c in unique.items() if c["columns"] == [column] and c["unique"]]
        assert on_column == [adopted]  # adopted, not added a second time
    assert fetchall("SELECT claim_generation, fence_required, claim_token FROM soniq_jobs") == [
        (0, False, None)
    ]


def test_old_rows_start_with_generation_zero_no_token_no_submission(at_format1):
    legacy_worker = "6d4f1c52-3e2b-4c1e-9a55-7f1d2b3c4d5e".replace("-", "")
    for status in ("queued", "processing", "done", "cancelled"):
        worker = legacy_worker if status == "processing" else None
        insert_format1_job(status=status, worker_id=worker)
    insert_format1_dead_letter()

    migrate()

    jobs = fetchall(
        "SELECT claim_generation, claim_token, claim_owner, lease_expires_at, fence_required, "
        "cancel_requested, pid, active_key, submission_id, submission_fingerprint FROM soniq_jobs"
    )
    assert len(jobs) == 4
    assert set(jobs) == {(0, None, None, None, False, False, None, None, None, None)}
    dead = fetchall("SELECT fence_required, submission_id, submission_fingerprint "
                    "FROM soniq_dead_letter_jobs")
    assert dead == [(False, None, None)]


def test_the_migrated_schema_passes_the_check(at_latest_afterwards):
    assert check_owned_schema(connection) == []


def test_check_after_0003_requires_the_exact_unique_index(at_latest_afterwards):
    if PG:
        execute("ALTER TABLE soniq_jobs DROP CONSTRAINT soniq_jobs_claim_token_key")
    else:
        execute("DROP INDEX soniq_jobs_claim_token_key")
    problems = check_owned_schema(connection)
    assert [(p.table, p.name, p.rule) for p in problems] == [
        ("soniq_jobs", "claim_token", "index-missing")
    ]
    with pytest.raises(CommandError, match=r"soniq_jobs\.claim_token.*index-missing"):
        call_command("soniq_check_schema", stdout=StringIO())


# SQLite cannot retype a column in place; there the CHAR rule is tested before 0003.
@pytest.mark.postgresql_only
def test_check_after_0003_refuses_a_column_changed_to_char(at_latest_afterwards):
    execute("ALTER TABLE soniq_jobs ALTER COLUMN claim_owner TYPE char(255)")
    problems = check_owned_schema(connection)
    assert ("soniq_jobs", "claim_owner", "varchar-required") in [
        (p.table, p.name, p.rule) for p in problems]


def test_check_schema_command_prints_ok_lines(at_latest_afterwards):
    out = StringIO()
    call_command("soniq_check_schema", stdout=out)
    assert "migration 0003 (owned queue) is applied" in out.getvalue()
    assert "ok soniq_jobs.claim_token" in out.getvalue()
    assert "ok soniq_dead_letter_jobs.submission_id" in out.getvalue()


def test_check_schema_command_before_0003(at_format1):
    out = StringIO()
    call_command("soniq_check_schema", stdout=out)
    assert "is not applied" in out.getvalue()
    assert "ok soniq_jobs.claim_token (absent; 0003 adds it)" in out.getvalue()

    execute(ADD + "claim_token char(255) NULL")
    with pytest.raises(CommandError) as refused:
        call_command("soniq_check_schema", stdout=StringIO())
    assert "soniq_jobs.claim_token" in str(refused.value)
    assert "varchar-required" in str(refused.value)


# --------------------------------------------------------------------------
# SQLite: declared collations and the native probe


def _everything():
    """Schema objects (main and temp) and every row of every soniq table."""
    shape = fetchall("SELECT type, name, sql FROM sqlite_master ORDER BY name")
    temp = fetchall("SELECT type, name, sql FROM sqlite_temp_master ORDER BY name")
    return shape, temp, rows_snapshot()


@sqlite_only
def test_sqlite_probe_passes_and_leaves_nothing_behind(at_latest_afterwards):
    insert_format1_job(status="done")
    before = _everything()
    assert admission.sqlite_binary_probe(connection) is True
    assert _everything() == before
    assert before[1] == []  # and no temporary object at all

    # Inside a caller's transaction, only the probe is undone.
    with transaction.atomic():
        insert_format1_job(status="queued")
        assert admission.sqlite_binary_probe(connection) is True
        assert fetchall("SELECT count(*) FROM soniq_jobs") == [(2,)]
        assert fetchall("SELECT count(*) FROM sqlite_temp_master") == [(0,)]
    assert fetchall("SELECT count(*) FROM soniq_jobs") == [(2,)]


@sqlite_only
def test_sqlite_probe_refuses_a_connection_whose_binary_collation_folds_case(
        at_latest_afterwards):
    def folding(left, right):
        left, right = left.lower().rstrip(), right.lower().rstrip()
        return (left > right) - (left < right)

    connection.ensure_connection()
    # Python's sqlite3 lets a connection replace BINARY: the probe must notice.
    connection.connection.create_collation("BINARY", folding)
    before = _everything()
    try:
        assert admission.sqlite_binary_probe(connection) is False
        problems = check_owned_schema(connection)
        assert [(p.table, p.rule) for p in problems] == [("database", "sqlite-binary-probe")]
        assert _everything() == before
    finally:
        connection.close()  # the override dies with the connection


@sqlite_only
def test_sqlite_declared_collation_is_read_from_the_table_definition():
    sql = ('CREATE TABLE "t" ("a" varchar(9) DEFAULT \'collate nocase\', b text collate '
           'RTRIM, [c d] varchar(255) COLLATE "binary", e decimal(10, 2))')
    assert schema_catalog._sqlite_declared_collation(sql, "a") is None
    assert schema_catalog._sqlite_declared_collation(sql, "b") == "RTRIM"
    assert schema_catalog._sqlite_declared_collation(sql, "c d") == "BINARY"
    assert schema_catalog._sqlite_declared_collation(sql, "e") is None


# --------------------------------------------------------------------------
# PostgreSQL: deterministic collations


def _create_nondeterministic_collation():
    try:
        with transaction.atomic():
            execute("CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', "
                    "deterministic = false)")
    except Exception as error:  # noqa: BLE001 - any failure means "no ICU here"
        reason = (f"this PostgreSQL server was built without ICU ({type(error).__name__}), so "
                  "no nondeterministic collation can exist on it to be refused")
        unavailable(f"{reason}; CI's server (Debian's PostgreSQL) has ICU")


@pytest.mark.postgresql_only
def test_a_nondeterministic_column_collation_is_refused(at_format1):
    _create_nondeterministic_collation()
    execute(ADD + "claim_token varchar(255) COLLATE ci NULL")
    execute(ADD_DLQ + "submission_id varchar(255) COLLATE ci NULL")
    before = schema_snapshot()
    with pytest.raises(SchemaAdmissionError) as refused:
        migrate()
    assert_refused(refused.value, "soniq_jobs", "claim_token", "collation-deterministic")
    assert_refused(refused.value, "soniq_dead_letter_jobs", "submission_id",
                    "collation-deterministic")
    assert schema_snapshot() == before


@pytest.mark.postgresql_only
def test_a_nondeterministically_collated_index_is_refused(at_format1):
    _create_nondeterministic_collation()
    execute(TOKEN)
    execute("CREATE UNIQUE INDEX hostile_idx ON soniq_jobs (claim_token COLLATE ci)")
    with pytest.raises(SchemaAdmissionError) as refused:
        admit_owned_schema(connection)
    assert_refused(refused.value, "soniq_jobs", "hostile_idx", "index-collation")


@pytest.mark.postgresql_only
def test_a_nondeterministic_database_default_collation_is_refused(at_format1, monkeypatch):
    # No released PostgreSQL lets a database default be nondeterministic, so the
    # server cannot be made hostile; the probe's answer is replaced instead.
    assert schema_catalog.pg_default_collation_deterministic(connection) is True
    with monkeypatch.context() as patch:
        patch.setattr(schema_catalog, "pg_default_collation_deterministic", lambda conn: False)
        with pytest.raises(SchemaAdmissionError) as refused:
            migrate()
    assert_refused(refused.value, "database", "", "database-collation")
    assert "0003_owned_queue" not in applied_soniq_migrations()

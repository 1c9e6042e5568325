"""One translation of database errors (errors.translate), fed real errors.

Every error here comes from the real database of the run: a unique
violation, a trigger's RAISE, a missing table, a lock that is not
granted, a terminated backend, the SQL API's HINTs. The tables say which
code each one must become; the last tests provoke each failure class on
enqueue, bulk_enqueue and get_job and check that no ``django.db`` error
gets out.
"""

import contextlib
import sqlite3
import uuid

import pytest
from django.db import DatabaseError, connection, connections, transaction
from hypothesis import HealthCheck, given, settings as hypothesis_settings, strategies as st

from soniq_django import bulk_enqueue, enqueue, get_job
from soniq_django.errors import (
    ConfigValidationError, ErrorCode, MigrationsNotApplied, SoniqError, translate,
)
from soniq_django.models import DeadLetterJob, Job
from soniq_django.producer.request import JobRequest
from tests.support.outages import lose_connection
from tests.support.owned import drop_refusal, refuse_updates

PG = connection.vendor == "postgresql"
SECRET = "secret-7f3a"  # in every driver message below; never in a translated error


def _failing(sql: str, params=None, using: str = "default") -> DatabaseError:
    """The ``django.db`` error that running ``sql`` raises (in a savepoint)."""
    try:
        with transaction.atomic(using=using), connections[using].cursor() as cursor:
            cursor.execute(sql, params)
    except DatabaseError as error:
        return error
    raise AssertionError(f"expected {sql!r} to fail")


def _raised(call) -> DatabaseError:
    try:
        with transaction.atomic():
            call()
    except DatabaseError as error:
        return error
    raise AssertionError("expected a database error")


def _assert_clean(error: SoniqError, *secrets) -> None:
    """The translated error names no driver text, id or token."""
    for secret in (SECRET, *secrets):
        assert str(secret) not in str(error)
        assert str(secret) not in error.reason


def _job(**values) -> Job:
    return Job.objects.create(job_name="errors.job", args={}, **values)


# --------------------------------------------------------------------------
# The table: one real error per row, both backends


def _duplicate_job_id():
    job = _job()
    return _raised(lambda: Job.objects.create(id=job.id, job_name="errors.job", args={})), job.id


def _duplicate_dead_letter_id():
    values = dict(job_name="errors.job", args={}, attempts=1, max_attempts=1,
                  dead_letter_reason="permanent_failure")
    dead = DeadLetterJob.objects.create(id=uuid.uuid4(), **values)
    return _raised(lambda: DeadLetterJob.objects.create(id=dead.id, **values)), dead.id


def _claim_token_taken():
    first, second = _job(), _job()
    Job.objects.filter(id=first.id).update(claim_token=SECRET)
    return _raised(lambda: Job.objects.filter(id=second.id).update(claim_token=SECRET)), SECRET


def _trigger_raises():
    job = _job()
    refuse_updates("true", "1")
    try:
        return _raised(lambda: Job.objects.filter(id=job.id).update(priority=1)), job.id
    finally:
        drop_refusal()


def _missing_table():
    return _failing(f'SELECT * FROM "{SECRET}"'), SECRET


def _missing_soniq_table():
    return _failing(f'SELECT * FROM "soniq_{SECRET}"'), SECRET


def _missing_soniq_function():
    name = "soniq_" + SECRET.replace("-", "_")
    return _failing(f"SELECT {name}()"), name


def _missing_soniq_column():
    return _failing(f'SELECT "soniq_jobs"."{SECRET}" FROM soniq_jobs'), SECRET


def _not_null():
    job = _job()
    key = job.id if PG else job.id.hex  # as each backend stores a UUID
    return _failing("UPDATE soniq_jobs SET job_name = NULL WHERE id = %s", [key]), job.id


def _unmigrated(what: str) -> str:
    return (f"soniq_django migrations are not applied on this database ({what}: a soniq table "
            "or function is missing). Run: python manage.py migrate soniq_django")


CASES = {
    "duplicate job id": (_duplicate_job_id, ErrorCode.DUPLICATE_JOB_ID, None),
    "duplicate dead-letter id": (_duplicate_dead_letter_id, ErrorCode.DUPLICATE_JOB_ID, None),
    "claim token taken": (_claim_token_taken, ErrorCode.QUEUE_CLAIM_CONFLICT, "nonce_reused"),
    "trigger raises": (_trigger_raises, ErrorCode.QUEUE_DATABASE_REFUSED,
                       "the database refused the operation (SQLSTATE "
                       + ("P0001)" if PG else "23000)")),
    "missing table": (_missing_table, ErrorCode.QUEUE_DATABASE_REFUSED,
                      "the database refused the operation ("
                      + ("SQLSTATE 42P01)" if PG else "SQLITE_ERROR)")),
    # A soniq object missing: its migrations have not run (MigrationsNotApplied).
    "missing soniq table": (_missing_soniq_table, ErrorCode.QUEUE_DATABASE_REFUSED,
                            _unmigrated("SQLSTATE 42P01" if PG else "SQLITE_ERROR")),
    "missing soniq function": (_missing_soniq_function, ErrorCode.QUEUE_DATABASE_REFUSED,
                               _unmigrated("SQLSTATE 42883" if PG else "SQLITE_ERROR")),
    "missing soniq column": (_missing_soniq_column, ErrorCode.QUEUE_DATABASE_REFUSED,
                             _unmigrated("SQLSTATE 42703" if PG else "SQLITE_ERROR")),
    "not null": (_not_null, ErrorCode.QUEUE_DATABASE_REFUSED,
                 "the database refused the operation (SQLSTATE 23502)"),
}


@pytest.mark.django_db
@pytest.mark.parametrize("case", list(CASES))
def test_each_real_error_becomes_its_code(case):
    provoke, code, reason = CASES[case]
    error, secret = provoke()
    translated = translate(error)
    assert translated.code is code
    if reason is not None:
        assert translated.reason == reason
    _assert_clean(translated, secret)


@pytest.mark.django_db
def test_a_missing_soniq_table_names_the_alias_and_its_migrate_when_known():
    translated = translate(_missing_soniq_table()[0], "default")
    assert isinstance(translated, MigrationsNotApplied)
    assert (translated.alias, translated.what) == (
        "default", "SQLSTATE 42P01" if PG else "SQLITE_ERROR")
    assert translated.reason.endswith("Run: python manage.py migrate soniq_django "
                                      "--database default")
    assert "on database 'default' (" in translated.reason


# --------------------------------------------------------------------------
# PostgreSQL: the SQL API's HINTs, classes of SQLSTATE, timeouts


HINTED = [
    ("SELECT soniq_enqueue(%s, '{}')", ["Bad Name " + SECRET], ErrorCode.INVALID_TASK_NAME),
    ("SELECT soniq_enqueue('a.b', %s::jsonb)", [f'["{SECRET}"]'], ErrorCode.TASK_ARGS_INVALID),
    ("SELECT soniq_enqueue('a.b', '{}', max_attempts => 0)", [], ErrorCode.INVALID_MAX_ATTEMPTS),
    ("SELECT soniq_enqueue('a.b', '{}', queue => '')", [], ErrorCode.INVALID_OPTION),
    ("SELECT * FROM soniq_claim('', %s)", [SECRET], ErrorCode.CONFIG),
]


@pytest.mark.postgresql_only
@pytest.mark.django_db
@pytest.mark.parametrize(("sql", "params", "code"), HINTED, ids=[c for *_, c in HINTED])
def test_each_hint_of_the_sql_api_becomes_its_validation_code(sql, params, code):
    translated = translate(_failing(sql, params))
    assert type(translated) is ConfigValidationError
    assert translated.code is code
    _assert_clean(translated)


@pytest.mark.postgresql_only
@pytest.mark.django_db
def test_a_reused_nonce_becomes_a_claim_conflict():
    _job()
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM soniq_claim('w', %s)", [SECRET])
    _job()
    translated = translate(_failing("SELECT * FROM soniq_claim('w', %s)", [SECRET]))
    assert (translated.code, translated.reason) == (ErrorCode.QUEUE_CLAIM_CONFLICT, "nonce_reused")
    _assert_clean(translated)


UNAVAILABLE = ["08006", "40001", "40P01", "53300", "55P03", "57P01", "57014", "58030"]
REFUSED = ["0A000", "22012", "23514", "25P02", "2F005", "42883", "54001", "P0001", "XX000"]


@pytest.mark.postgresql_only
@pytest.mark.django_db
@hypothesis_settings(max_examples=60, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(state=st.sampled_from(UNAVAILABLE + REFUSED),
       text=st.text(st.characters(codec="utf-8", exclude_characters="\x00'$"), max_size=20),
       hint=st.sampled_from(["", "NOT_OURS", "SONIQ_NOT_A_CODE"]))
def test_a_sqlstate_class_decides_unavailable_or_refused(state, text, hint):
    message = SECRET + text
    with_hint = f", HINT = '{hint}'" if hint else ""
    error = _failing(f"DO $$ BEGIN RAISE EXCEPTION USING MESSAGE = '{message}', "
                     f"ERRCODE = '{state}'{with_hint}; END $$")
    assert error.__cause__.sqlstate == state
    translated = translate(error)
    if state in UNAVAILABLE:
        assert (translated.code, translated.reason) == (
            ErrorCode.QUEUE_PERSISTENCE_FAILED, "unavailable")
    else:
        assert translated.code is ErrorCode.QUEUE_DATABASE_REFUSED
        assert translated.reason == f"the database refused the operation (SQLSTATE {state})"
    _assert_clean(translated, message)


@pytest.mark.postgresql_only
@pytest.mark.django_db
def test_a_statement_timeout_is_unavailable():
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL statement_timeout = '20ms'")
        error = _failing("SELECT pg_sleep(2)")
    assert error.__cause__.sqlstate == "57014"
    assert translate(error).code is ErrorCode.QUEUE_PERSISTENCE_FAILED


@pytest.mark.postgresql_only
@pytest.mark.django_db
@pytest.mark.parametrize(("sql", "state"), [
    ("EXECUTE soniq_never_prepared", "26000"),
    ("PREPARE soniq_twice AS SELECT 1; PREPARE soniq_twice AS SELECT 2", "42P05"),
], ids=["missing", "taken"])
def test_a_missing_or_taken_prepared_statement_is_refused_with_a_hint_at_poolers(sql, state):
    # What a transaction pooler does to prepared statements (docs/deployment.md).
    try:
        error = _failing(sql)
    finally:  # a prepared statement outlives the transaction that failed
        with connection.cursor() as cursor:
            cursor.execute("SELECT name FROM pg_prepared_statements WHERE name = 'soniq_twice'")
            if cursor.fetchone():
                cursor.execute("DEALLOCATE soniq_twice")
    assert error.__cause__.sqlstate == state
    translated = translate(error)
    assert translated.code is ErrorCode.QUEUE_DATABASE_REFUSED
    assert f"(SQLSTATE {state})" in translated.reason
    assert "transaction pooler" in translated.reason and "docs/deployment.md" in translated.reason
    _assert_clean(translated, "soniq_never_prepared", "soniq_twice")


# --------------------------------------------------------------------------
# Failures of the database itself, on enqueue, bulk_enqueue and get_job


CALLS = {
    "enqueue": lambda: enqueue("errors.job", {"secret": SECRET}),
    "enqueue unique": lambda: enqueue("errors.job", {"secret": SECRET}, unique_job=True),
    "bulk_enqueue": lambda: bulk_enqueue([JobRequest("errors.job", {"secret": SECRET}),
                                          JobRequest("errors.job", dedup_key=SECRET)]),
    "get_job": lambda: get_job(uuid.uuid4()),
}


def _translated_failure(call) -> SoniqError:
    try:
        call()
    except SoniqError as error:
        _assert_clean(error)
        return error
    except DatabaseError as error:  # pragma: no cover - the bug these tests exist for
        raise AssertionError(f"a raw {type(error).__name__} leaked") from error
    raise AssertionError("expected a failure")


@contextlib.contextmanager
def _locked_out():
    """Another connection holds soniq_jobs; this one gives up at once."""
    if PG:
        other = connections.create_connection("default")
        try:
            with other.cursor() as cursor:
                cursor.execute("BEGIN")
                cursor.execute("LOCK TABLE soniq_jobs IN ACCESS EXCLUSIVE MODE")
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = '50ms'")
            yield
        finally:
            other.close()
            with connection.cursor() as cursor:
                cursor.execute("RESET lock_timeout")
        return
    connection.ensure_connection()
    other = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None, timeout=0)
    try:
        other.execute("BEGIN EXCLUSIVE")  # keeps readers out too (rollback journal)
        connection.connection.execute("PRAGMA busy_timeout = 0")
        yield
    finally:
        other.close()
        connection.close()  # back to the configured busy timeout


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("call", list(CALLS))
def test_a_locked_database_is_persistence_failed_on_the_enqueue_path(call):
    with _locked_out():
        error = _translated_failure(CALLS[call])
    assert error.code is ErrorCode.QUEUE_PERSISTENCE_FAILED
    assert Job.objects.count() == 0


@pytest.mark.postgresql_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("call", list(CALLS))
def test_a_terminated_backend_is_persistence_failed_on_the_enqueue_path(call):
    lose_connection()
    try:
        assert _translated_failure(CALLS[call]).code is ErrorCode.QUEUE_PERSISTENCE_FAILED
    finally:
        connection.close()
    assert Job.objects.count() == 0


@pytest.mark.postgresql_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("call", list(CALLS))
def test_a_connection_closed_under_django_is_persistence_failed(call):
    connection.ensure_connection()
    connection.connection.close()  # psycopg: "the connection is closed", no SQLSTATE
    try:
        assert _translated_failure(CALLS[call]).code is ErrorCode.QUEUE_PERSISTENCE_FAILED
    finally:
        connection.close()


@contextlib.contextmanager
def _refusing_inserts():
    with connection.cursor() as cursor:
        if PG:
            cursor.execute("CREATE FUNCTION test_refuse() RETURNS trigger LANGUAGE plpgsql AS "
                           f"$$ BEGIN RAISE EXCEPTION '{SECRET}'; END $$")
            cursor.execute("CREATE TRIGGER test_refuse BEFORE INSERT ON soniq_jobs "
                           "FOR EACH ROW EXECUTE FUNCTION test_refuse()")
        else:
            cursor.execute("CREATE TRIGGER test_refuse BEFORE INSERT ON soniq_jobs "
                           f"BEGIN SELECT RAISE(ABORT, '{SECRET}'); END")
    try:
        yield
    finally:
        drop_refusal()


@pytest.mark.django_db
@pytest.mark.parametrize("call", ["enqueue", "enqueue unique", "bulk_enqueue"])
def test_a_trigger_that_refuses_is_database_refused_on_the_enqueue_path(call):
    with _refusing_inserts():
        error = _translated_failure(CALLS[call])
    assert error.code is ErrorCode.QUEUE_DATABASE_REFUSED
    assert error.reason == "the database refused the operation (SQLSTATE %s)" % (
        "P0001" if PG else "23000")
    assert Job.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.parametrize("call", list(CALLS))
def test_a_broken_enclosing_transaction_is_database_refused(call):
    with transaction.atomic():
        # An error caught inside atomic() without a savepoint breaks the transaction.
        with contextlib.suppress(DatabaseError), transaction.atomic(savepoint=False), \
                connection.cursor() as cursor:
            cursor.execute('SELECT * FROM "no such table"')
        error = _translated_failure(CALLS[call])
        transaction.set_rollback(True)
    assert error.code is ErrorCode.QUEUE_DATABASE_REFUSED
    assert "TransactionManagementError" in error.reason

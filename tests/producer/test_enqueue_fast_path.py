"""enqueue()'s own path (docs/decisions/0028): who makes the id, and the checks it makes cheaply.

``enqueue()`` validates through the same ``_prepare`` as ``JobRequest`` +
``prepare``, but lets the database make the id of a job that names none
(PostgreSQL: ``soniq_enqueue`` with job_id NULL), and runs Django's cursor
checks and soniq's per-connection answers (prepared or not, its cursor)
once per psycopg connection. Each test here fails if one of those shortcuts
skips what the general path would have done.
"""

import datetime as dt
import threading
import uuid

import psycopg
import pytest
from asgiref.sync import async_to_sync
from django.db import DatabaseError, IntegrityError, connection, connections, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soniq_django import aenqueue, enqueue, signals
from soniq_django.errors import ErrorCode, SoniqError
from soniq_django.models import Job
from soniq_django.producer.request import SERVER_MADE_ID, JobRequest, prepare
from tests.testapp.jobs import add

pytestmark = pytest.mark.django_db

AWARE = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
OPTIONS = {
    "queue": st.sampled_from([None, "q", "", "x" * 256, "a\x00b", 5]),
    "priority": st.sampled_from([None, 0, -(2**31) - 1, 2**31, "1", 1.5, True]),
    "run_at": st.sampled_from([None, AWARE, AWARE.replace(tzinfo=None), dt.timedelta(1),
                               dt.timedelta(-1), dt.timedelta(days=40000), "soon"]),
    "max_attempts": st.sampled_from([4, None, 0, 1, 2**31, "3", True, 2.0]),
    "unique_job": st.sampled_from([False, True, 1, None]),
    "dedup_key": st.sampled_from([None, "k", "", "\x00", 3]),
    "producer_id": st.sampled_from([None, "p", "", "y" * 300]),
    "job_id": st.one_of(st.none(), st.uuids(version=4), st.uuids(version=4).map(str),
                        st.sampled_from(["nope", 5])),
    "delay": st.sampled_from([None, 0, 1.5, -1, float("inf"), float("nan"), 10**12, "1",
                              dt.timedelta(seconds=1)]),
}
NAMES = st.sampled_from(["a.b", "", "Bad.name", "a.b\n", None, 7])
ARGS = st.sampled_from([None, {}, {"x": 1}, [], "s", {1: 2}, {"x": float("nan")},
                        {"x": object()}, {"x": "\x00"}])


def outcome(call):
    try:
        call()
    except Exception as error:  # noqa: BLE001 - the outcome compared is the error itself
        return type(error), getattr(error, "code", None), str(error)
    return None


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(NAMES, ARGS, st.fixed_dictionaries(OPTIONS))
def test_enqueue_refuses_exactly_what_jobrequest_and_prepare_refuse(job_name, args, options):
    expected = outcome(lambda: prepare(JobRequest(job_name, args, **options)))
    before = Job.objects.count()
    with transaction.atomic():
        got = outcome(lambda: enqueue(job_name, args, **options))
        transaction.set_rollback(True)
    assert got == expected
    assert Job.objects.count() == before


def _in_loop(call):
    async def scenario():
        return await call()

    return async_to_sync(scenario)()


#: Every enqueue whose id its caller sees only once the row is in: the database may make it.
RETURNING_ID = {
    "enqueue": lambda n: enqueue("tests.add", {"a": n}),
    "handler.enqueue": lambda n: add.enqueue(n),
    "aenqueue": lambda n: _in_loop(lambda: aenqueue("tests.add", {"a": n})),
    "handler.aenqueue": lambda n: _in_loop(lambda: add.aenqueue(n)),
}


@pytest.mark.parametrize("how", list(RETURNING_ID))
def test_an_id_nobody_asked_for_is_a_fresh_version_4_uuid_stored_under_it(how):
    heard = []

    def heard_it(sender, job_id, **kwargs):
        heard.append(job_id)

    signals.job_enqueued.connect(heard_it)
    try:
        ids = [RETURNING_ID[how](n) for n in range(3)]
    finally:
        signals.job_enqueued.disconnect(heard_it)
    assert len(set(ids)) == 3 and SERVER_MADE_ID not in ids
    assert all(job_id.version == 4 and job_id.variant == uuid.RFC_4122 for job_id in ids)
    assert heard == ids
    assert {job.id: job.args["a"] for job in Job.objects.filter(id__in=ids)} == {
        job_id: n for n, job_id in enumerate(ids)}
    assert not Job.objects.filter(id=SERVER_MADE_ID).exists()


@pytest.mark.django_db(transaction=True)
def test_enqueue_on_commit_still_knows_its_id_before_the_insert():
    with transaction.atomic():
        job_id = add.enqueue_on_commit(5)
        assert job_id.version == 4 and not Job.objects.filter(id=job_id).exists()
    assert Job.objects.get(id=job_id).args == {"a": 5}


def _enqueue_call(captured):
    (sql,) = [query["sql"] for query in captured.captured_queries
              if "soniq_enqueue(" in query["sql"]]
    return sql


@pytest.mark.postgresql_only
def test_on_postgresql_the_server_makes_the_id_and_a_requested_one_is_sent():
    for how in RETURNING_ID:
        with CaptureQueriesContext(connection) as captured:
            made = RETURNING_ID[how](1)
        assert _enqueue_call(captured).endswith("NULL::uuid)"), how  # the server draws it
    requested = uuid.uuid4()
    with CaptureQueriesContext(connection) as captured:
        assert enqueue("a.asked", {}, job_id=str(requested)) == requested
    assert f"'{requested.hex}'::uuid" in _enqueue_call(captured)
    assert Job.objects.get(id=made).job_name == "tests.add"


@pytest.mark.postgresql_only
def test_enqueue_of_a_dead_lettered_id_is_still_a_duplicate():
    from soniq_django.models import DeadLetterJob

    taken = uuid.uuid4()
    DeadLetterJob.objects.create(id=taken, job_name="a.dead", args={},
                                 dead_letter_reason="permanent_failure")
    with pytest.raises(SoniqError) as caught:
        enqueue("a.again", {}, job_id=taken)
    assert caught.value.code is ErrorCode.DUPLICATE_JOB_ID


def _prepared_statements():
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements "
                       "WHERE statement LIKE 'SELECT soniq_enqueue(%%'")
        return cursor.fetchone()[0]


@pytest.fixture
def fresh_connection():
    connection.close()
    yield
    connection.close()


@pytest.mark.postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_settings_change_is_seen_by_the_next_enqueue_on_the_same_connection(
        fresh_connection):
    with override_settings(SONIQ={"PREPARED_STATEMENTS": False}):
        enqueue("a.first", {})
        raw = connection.connection
    assert _prepared_statements() == 0
    with override_settings(SONIQ={"PREPARED_STATEMENTS": True}):
        enqueue("a.second", {})
    assert connection.connection is raw and _prepared_statements() == 1


@pytest.mark.postgresql_only
@pytest.mark.django_db(transaction=True)
def test_disable_server_side_cursors_is_read_at_each_enqueue(fresh_connection, monkeypatch):
    monkeypatch.setitem(connection.settings_dict, "DISABLE_SERVER_SIDE_CURSORS", True)
    enqueue("a.first", {})
    assert _prepared_statements() == 0
    monkeypatch.setitem(connection.settings_dict, "DISABLE_SERVER_SIDE_CURSORS", False)
    enqueue("a.second", {})
    assert _prepared_statements() == 1


@pytest.mark.postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_due_health_check_replaces_a_dead_connection_before_the_enqueue(
        fresh_connection, monkeypatch):
    enqueue("a.before", {})
    monkeypatch.setattr(connection, "health_check_enabled", True)
    connection.health_check_done = False  # as at the start of a request (CONN_HEALTH_CHECKS)
    dead = connection.connection.info.backend_pid
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [dead])
    job_id = enqueue("a.after", {})
    assert connection.connection.info.backend_pid != dead
    assert Job.objects.get(id=job_id).job_name == "a.after"


@pytest.mark.postgresql_only
def test_a_broken_transaction_refuses_the_enqueue_as_django_would():
    with transaction.atomic():
        with pytest.raises(IntegrityError):
            Job.objects.create(id=Job.objects.get(id=enqueue("a.one", {})).id, job_name="a.b",
                               args={})
        with pytest.raises(SoniqError) as caught:
            enqueue("a.two", {})
    assert caught.value.code is ErrorCode.QUEUE_DATABASE_REFUSED
    assert "(TransactionManagementError)" in str(caught.value)


@pytest.mark.postgresql_only
def test_a_connection_used_from_another_thread_is_refused_as_django_would():
    from soniq_django.producer import _pg

    enqueue("a.warm", {})
    job = prepare(JobRequest("a.elsewhere", {}))
    main = connections["default"]
    caught = []

    def other_thread():
        try:
            _pg.enqueue(job, main, "default")
        except (DatabaseError, SoniqError) as error:
            caught.append(error)

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    # Refused before anything is sent (psycopg itself would let the thread in).
    assert [error.code for error in caught] == [ErrorCode.QUEUE_DATABASE_REFUSED]
    assert not Job.objects.filter(job_name="a.elsewhere").exists()

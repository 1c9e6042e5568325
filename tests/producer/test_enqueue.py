"""enqueue, bulk_enqueue and get_job on the real database (both backends)."""

import contextlib
import datetime as dt
import math
import uuid

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from soniq_django import args_hash, bulk_enqueue, enqueue, get_job
from soniq_django.errors import ConfigValidationError, ErrorCode, SoniqError
from soniq_django.producer.request import JobRequest
from soniq_django.models import DeadLetterJob, Job
from tests.support.concurrency import run_threads

pytestmark = pytest.mark.django_db


def test_enqueue_writes_a_format1_row():
    job_id = enqueue("billing.send_invoice", {"order_id": 1})
    row = Job.objects.get(id=job_id)
    assert isinstance(job_id, uuid.UUID) and job_id.version == 4
    assert (row.job_name, row.args, row.status, row.attempts) == (
        "billing.send_invoice", {"order_id": 1}, "queued", 0,
    )
    assert (row.queue, row.priority, row.max_attempts, row.unique_job) == ("default", 100, 4, False)
    assert row.args_hash is None and row.dedup_key is None and row.scheduled_at is None
    assert row.result is None and row.worker_id is None and row.expires_at is None


def test_enqueue_without_args_stores_an_empty_object():
    assert Job.objects.get(id=enqueue("reports.daily")).args == {}


def test_every_option_is_stored():
    run_at = timezone.now() + dt.timedelta(hours=1)
    job_id = uuid.uuid4()
    returned = enqueue(
        "billing.send_invoice",
        {"order_id": 2},
        queue="billing",
        priority=10,
        run_at=run_at,
        max_attempts=None,
        dedup_key="invoice-2",
        producer_id="checkout",
        job_id=str(job_id),
    )
    row = Job.objects.get(id=job_id)
    assert returned == job_id
    assert (row.queue, row.priority, row.max_attempts) == ("billing", 10, None)
    assert (row.dedup_key, row.producer_id) == ("invoice-2", "checkout")
    assert row.scheduled_at == run_at


@override_settings(SONIQ={"DEFAULT_QUEUE": "mail", "DEFAULT_PRIORITY": 5})
def test_defaults_come_from_settings_lazily():
    row = Job.objects.get(id=enqueue("mail.send"))
    assert (row.queue, row.priority) == ("mail", 5)


def test_a_handlerless_job_name_is_accepted():
    assert enqueue("other_service.job_written_in_go") is not None


@pytest.mark.parametrize(
    "name", ["Billing.send", "billing..send", "billing.", ".billing", "1abc", "a-b", "", "a.b\n",
             "ä", "billing.Send"],
)
def test_invalid_job_names(name):
    with pytest.raises(SoniqError) as caught:
        enqueue(name, {})
    assert caught.value.code is ErrorCode.INVALID_TASK_NAME
    assert not Job.objects.exists()


@pytest.mark.parametrize("name", [None, 5, b"billing.send"])
def test_job_name_must_be_a_string(name):
    with pytest.raises(SoniqError) as caught:
        enqueue(name)
    assert caught.value.code is ErrorCode.INVALID_TASK_NAME


def _set_database_pattern(pattern):
    """On PostgreSQL the SQL function enforces the database-level pattern too."""
    if connection.vendor == "postgresql":
        database = connection.ops.quote_name(connection.settings_dict["NAME"])
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER DATABASE {database} SET soniq.task_name_pattern = '{pattern}'")


@override_settings(SONIQ={"TASK_NAME_PATTERN": r"^[A-Z]+$"})
def test_task_name_pattern_setting_applies():
    _set_database_pattern(r"^[A-Z]+$")  # rolled back with the test's transaction
    enqueue("UPPER")
    with pytest.raises(SoniqError) as caught:
        enqueue("lower.case")
    assert caught.value.code is ErrorCode.INVALID_TASK_NAME


@pytest.mark.postgresql_only
def test_the_database_pattern_is_enforced_even_when_settings_allow_the_name():
    _set_database_pattern(r"^[a-z]+$")
    with pytest.raises(SoniqError) as caught:
        enqueue("billing.send_invoice")
    assert caught.value.code is ErrorCode.INVALID_TASK_NAME


@pytest.mark.parametrize(
    "args",
    [
        {"when": dt.datetime(2024, 1, 1, tzinfo=dt.UTC)},
        {"x": math.nan},
        {"x": math.inf},
        {"x": 10**400},
        {"x": b"bytes"},
        {"x": {1, 2}},
        {"x": "a\x00b"},
        [1, 2],
        "not an object",
    ],
)
def test_invalid_args_raise_task_args_invalid_and_write_nothing(args):
    with pytest.raises(SoniqError) as caught:
        enqueue("billing.send_invoice", args)
    assert caught.value.code is ErrorCode.TASK_ARGS_INVALID
    assert not Job.objects.exists()


def test_nesting_bound_on_enqueue():
    value: dict = {}
    for _ in range(498):
        value = {"a": value}
    enqueue("deep.ok", value)  # 499 levels
    with pytest.raises(SoniqError) as caught:
        enqueue("deep.too_deep", {"a": value})  # 500 levels
    assert caught.value.code is ErrorCode.TASK_ARGS_INVALID
    assert Job.objects.count() == 1


@pytest.mark.parametrize("max_attempts", [0, -1, True, 1.0, "3", 2**31])
def test_invalid_max_attempts(max_attempts):
    with pytest.raises(SoniqError) as caught:
        enqueue("billing.send_invoice", {}, max_attempts=max_attempts)
    assert caught.value.code is ErrorCode.INVALID_MAX_ATTEMPTS
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    "options",
    [
        {"queue": ""},
        {"queue": 5},
        {"queue": "q" * 256},
        {"priority": "high"},
        {"priority": True},
        {"priority": 2**31},
        {"run_at": dt.datetime(2030, 1, 1)},
        {"run_at": "tomorrow"},
        {"unique_job": 1},
        {"dedup_key": ""},
        {"producer_id": "a\x00b"},
        {"job_id": "not-a-uuid"},
        {"job_id": 12},
    ],
)
def test_invalid_options(options):
    with pytest.raises(ConfigValidationError) as caught:
        enqueue("billing.send_invoice", {}, **options)
    assert caught.value.code is ErrorCode.INVALID_OPTION
    assert not Job.objects.exists()


def test_existing_job_id_raises_duplicate_job_id():
    job_id = enqueue("billing.send_invoice", {"order_id": 1})
    with pytest.raises(SoniqError) as caught:
        enqueue("billing.send_invoice", {"order_id": 2}, job_id=job_id)
    assert caught.value.code is ErrorCode.DUPLICATE_JOB_ID
    assert str(job_id) not in str(caught.value)
    assert Job.objects.count() == 1


def test_duplicate_job_id_keeps_the_callers_transaction_usable():
    job_id = enqueue("billing.send_invoice", {})
    with transaction.atomic():
        with pytest.raises(SoniqError):
            enqueue("billing.send_invoice", {}, job_id=job_id)
        enqueue("billing.other", {})
    assert Job.objects.count() == 2


def test_unique_job_returns_the_queued_duplicate():
    first = enqueue("reports.build", {"day": "2024-01-01", "n": [1, 2]}, unique_job=True)
    again = enqueue("reports.build", {"n": [1, 2], "day": "2024-01-01"}, unique_job=True)
    other = enqueue("reports.build", {"day": "2024-01-02", "n": [1, 2]}, unique_job=True)
    assert first == again != other
    row = Job.objects.get(id=first)
    assert row.unique_job and row.args_hash == args_hash({"day": "2024-01-01", "n": [1, 2]})
    assert Job.objects.count() == 2


def test_unique_job_only_matches_queued_rows():
    first = enqueue("reports.build", {"day": "d"}, unique_job=True)
    Job.objects.filter(id=first).update(status="done")
    second = enqueue("reports.build", {"day": "d"}, unique_job=True)
    assert second != first


def test_unique_job_differs_by_job_name():
    a = enqueue("reports.a", {"day": "d"}, unique_job=True)
    b = enqueue("reports.b", {"day": "d"}, unique_job=True)
    assert a != b


def test_dedup_key_is_one_namespace_across_names_and_queues():
    first = enqueue("billing.send_invoice", {"order_id": 1}, dedup_key="invoice-1")
    again = enqueue("mail.other", {"x": 1}, queue="mail", dedup_key="invoice-1")
    assert first == again
    assert Job.objects.count() == 1
    Job.objects.filter(id=first).update(status="processing")
    assert enqueue("billing.send_invoice", {}, dedup_key="invoice-1") != first


def test_duplicate_ignores_requested_job_id():
    first = enqueue("reports.build", {"day": "d"}, unique_job=True)
    assert enqueue("reports.build", {"day": "d"}, unique_job=True, job_id=uuid.uuid4()) == first


def test_enqueue_is_inside_the_callers_transaction():
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            enqueue("billing.send_invoice", {})
            raise RuntimeError
    assert not Job.objects.exists()


def test_bulk_enqueue_returns_ids_in_order_and_dedups():
    ids = bulk_enqueue(
        [
            JobRequest("a.one", {"n": 1}),
            JobRequest("a.two", {"n": 2}, dedup_key="k"),
            JobRequest("a.three", {"n": 3}, queue="q", priority=1),
            JobRequest("a.four", {"n": 4}, dedup_key="k"),
            JobRequest("a.five", {"n": 5}, unique_job=True),
            JobRequest("a.five", {"n": 5}, unique_job=True),
        ]
    )
    assert len(ids) == 6 and ids[1] == ids[3] and ids[4] == ids[5]
    assert Job.objects.count() == 4
    names = dict(Job.objects.values_list("id", "job_name"))
    assert [names[i] for i in ids] == ["a.one", "a.two", "a.three", "a.two", "a.five", "a.five"]


def test_bulk_enqueue_validates_everything_before_writing():
    with pytest.raises(SoniqError) as caught:
        bulk_enqueue([JobRequest("a.good", {}), JobRequest("a.bad", {"x": math.nan})])
    assert caught.value.code is ErrorCode.TASK_ARGS_INVALID
    assert not Job.objects.exists()


def test_bulk_enqueue_duplicate_id_writes_nothing():
    existing = enqueue("a.one", {})
    with pytest.raises(SoniqError) as caught:
        bulk_enqueue([JobRequest("a.two", {}), JobRequest("a.three", {}, job_id=existing)])
    assert caught.value.code is ErrorCode.DUPLICATE_JOB_ID
    assert Job.objects.count() == 1


def test_bulk_enqueue_of_nothing():
    assert bulk_enqueue([]) == []


ROW_FIELDS = ("job_name", "args", "args_hash", "status", "attempts", "max_attempts", "queue",
              "priority", "unique_job", "dedup_key", "scheduled_at", "producer_id")


def _mixed_requests():
    later = dt.datetime(2999, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)
    return [
        JobRequest("a.plain", {"n": 1, "nested": {"b": [1, 2.5, None, True]}}),
        JobRequest("a.options", {"s": "é😀"}, queue="q", priority=-7, run_at=later,
                   max_attempts=None, producer_id="checkout"),
        JobRequest("a.unique", {"day": "d"}, unique_job=True),
        JobRequest("a.keyed", {}, dedup_key="k1", max_attempts=9),
        JobRequest("a.unique", {"day": "d"}, unique_job=True, queue="other"),
        JobRequest("a.other", {"x": 1}, dedup_key="k1"),
        JobRequest("a.both", {"day": "e"}, unique_job=True, dedup_key="k2"),
        JobRequest("a.given", {}, job_id="4f0d3c52-5e44-4c7e-9f6e-2f1c3a4b5c6d"),
    ]


def _rows(ids):
    rows = {row["id"]: row for row in Job.objects.values("id", *ROW_FIELDS)}
    first = {}
    shape = [first.setdefault(i, n) for n, i in enumerate(ids)]
    return [tuple(rows[i][f] for f in ROW_FIELDS) for i in ids], shape, len(rows)


def test_bulk_enqueue_writes_the_rows_enqueue_writes():
    with transaction.atomic():
        one_by_one = _rows([
            enqueue(r.job_name, r.args, queue=r.queue, priority=r.priority, run_at=r.run_at,
                    max_attempts=r.max_attempts, unique_job=r.unique_job,
                    dedup_key=r.dedup_key, producer_id=r.producer_id, job_id=r.job_id)
            for r in _mixed_requests()])
        transaction.set_rollback(True)
    assert not Job.objects.exists()
    ids = bulk_enqueue(_mixed_requests())
    assert _rows(ids) == one_by_one
    assert one_by_one[1] == [0, 1, 2, 3, 2, 3, 6, 7] and one_by_one[2] == 6
    assert ids[7] == uuid.UUID("4f0d3c52-5e44-4c7e-9f6e-2f1c3a4b5c6d")


def test_bulk_enqueue_dedups_against_jobs_already_queued():
    unique = enqueue("a.unique", {"day": "d"}, unique_job=True)
    keyed = enqueue("a.keyed", {}, dedup_key="k1")
    ids = bulk_enqueue([JobRequest("a.plain", {}), JobRequest("a.unique", {"day": "d"},
                                                              unique_job=True),
                        JobRequest("a.again", {"y": 2}, dedup_key="k1")])
    assert ids[1:] == [unique, keyed]
    assert Job.objects.count() == 3


def test_enqueue_and_bulk_enqueue_are_seen_by_query_logging_and_execute_wrappers():
    seen = []

    def wrapper(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with CaptureQueriesContext(connection) as captured, connection.execute_wrapper(wrapper):
        job_id = enqueue("a.logged", {"n": 1})
        ids = bulk_enqueue([JobRequest("a.logged", {"n": 2}), JobRequest("a.logged", {"n": 3})])
    assert captured.captured_queries and len(seen) == len(captured.captured_queries)
    if connection.vendor == "postgresql":
        assert any("soniq_enqueue(" in sql for sql in seen)
        assert any("soniq_enqueue_many(" in sql for sql in seen)
    assert Job.objects.filter(id__in=[job_id, *ids]).count() == 3


@pytest.mark.postgresql_only
@pytest.mark.parametrize(
    ("setting", "disable_cursors", "user_threshold", "prepared"),
    [(None, False, None, True), (None, True, None, False), (True, True, None, True),
     (False, False, None, False), (False, False, 5, False), (None, False, 5, True)],
)
def test_the_enqueue_statement_is_prepared_as_configured(
        setting, disable_cursors, user_threshold, prepared, monkeypatch):
    connection.ensure_connection()
    monkeypatch.setitem(connection.settings_dict, "DISABLE_SERVER_SIDE_CURSORS", disable_cursors)
    monkeypatch.setattr(connection.connection, "prepare_threshold", user_threshold)

    def statements():
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement FROM pg_prepared_statements")
            return [row[0] for row in cursor.fetchall()]

    assert statements() == []
    with override_settings(SONIQ={"PREPARED_STATEMENTS": setting}):
        for n in range(3):
            enqueue("a.prepared", {"n": n})
    found = statements()
    assert [s for s in found if "soniq_enqueue(" in s] == (
        ["SELECT soniq_enqueue($1::text, $2::jsonb, $3::text, $4::integer, $5::timestamptz, "
         "$6::integer, $7::boolean, $8::text, $9::text, $10::uuid)"] if prepared else [])
    assert len(found) == (1 if prepared else 0)  # Django's own queries never are
    assert connection.connection.prepare_threshold == user_threshold
    assert Job.objects.filter(job_name="a.prepared").count() == 3


@pytest.fixture
def fresh_connection():
    """A new connection for the test (none of its statements prepared), closed at the end."""
    connection.close()
    yield
    connection.close()


@pytest.mark.postgresql_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("in_atomic", [False, True], ids=["autocommit", "atomic"])
def test_a_prepared_call_that_meets_a_taken_statement_name_is_sent_again_unprepared(
        in_atomic, fresh_connection, caplog, monkeypatch):
    # Behind a transaction pooler another client's statement may hold the name
    # psycopg gives ours (42P05); here the same session holds it, for real.
    from soniq_django.producer import _pg

    monkeypatch.setattr(_pg, "_warned", set(), raising=False)
    connection.ensure_connection()
    taken = f"_pg3_{connection.connection._prepared._prepared_idx}"  # psycopg's next name
    with connection.cursor() as cursor:
        cursor.execute(f"PREPARE {taken} AS SELECT 1")
    with override_settings(SONIQ={"PREPARED_STATEMENTS": True}):
        with transaction.atomic() if in_atomic else contextlib.nullcontext():
            first = enqueue("a.taken", {"n": 1})
            rest = bulk_enqueue([JobRequest("a.taken", {"n": 2})])
            assert Job.objects.filter(job_name="a.taken").count() == 2  # the transaction is fine
    assert set(Job.objects.filter(job_name="a.taken").values_list("id", flat=True)) == {
        first, *rest}
    with connection.cursor() as cursor:
        cursor.execute("SELECT name, statement FROM pg_prepared_statements")
        assert cursor.fetchall() == [(taken, f"PREPARE {taken} AS SELECT 1")]  # nothing more
    assert "SONIQ['PREPARED_STATEMENTS']" in caplog.text and "42P05" in caplog.text


def test_get_job_reads_a_queued_job():
    job_id = enqueue("billing.send_invoice", {"order_id": 1}, queue="billing", max_attempts=3)
    info = get_job(job_id)
    assert info.id == job_id and info.job_name == "billing.send_invoice"
    assert (info.status, info.queue, info.attempts, info.max_attempts) == ("queued", "billing", 0, 3)
    assert info.result is None and info.dead_letter_reason is None
    assert info.created_at is not None and info.updated_at is not None
    assert get_job(str(job_id)) == info


def test_get_job_unknown_and_expired_are_none():
    assert get_job(uuid.uuid4()) is None
    job_id = enqueue("billing.send_invoice", {})
    Job.objects.filter(id=job_id).update(
        status="done", result={"ok": True}, expires_at=timezone.now() - dt.timedelta(seconds=1)
    )
    assert get_job(job_id) is None
    Job.objects.filter(id=job_id).update(expires_at=timezone.now() + dt.timedelta(minutes=5))
    assert get_job(job_id).result == {"ok": True}


def test_get_job_reports_dead_letters():
    job_id = uuid.uuid4()
    created = timezone.now() - dt.timedelta(hours=1)
    DeadLetterJob.objects.create(
        id=job_id, job_name="billing.send_invoice", args={}, queue="billing", attempts=4,
        max_attempts=4, last_error="boom", dead_letter_reason="max_retries_exceeded",
        original_created_at=created,
    )
    info = get_job(job_id)
    assert (info.status, info.dead_letter_reason, info.last_error) == (
        "dead_letter", "max_retries_exceeded", "boom",
    )
    assert info.created_at == created


def test_get_job_rejects_a_non_uuid():
    with pytest.raises(ConfigValidationError):
        get_job("nope")


@pytest.mark.django_db(transaction=True)
def test_concurrent_unique_enqueues_make_one_job():
    results = run_threads(lambda _: enqueue("reports.build", {"day": "race"}, unique_job=True), 6)
    assert len(set(results)) == 1
    assert Job.objects.filter(job_name="reports.build").count() == 1


def test_get_job_ignores_a_dead_letter_replayed_since_it_failed():
    job_id = uuid.uuid4()
    moved = timezone.now() - dt.timedelta(minutes=10)
    DeadLetterJob.objects.create(
        id=job_id, job_name="a.b", args={}, dead_letter_reason="permanent_failure",
        moved_to_dead_letter_at=moved, last_resurrection_at=moved + dt.timedelta(minutes=1),
        resurrection_count=1,
    )
    assert get_job(job_id) is None  # replayed, then finished and expired
    DeadLetterJob.objects.filter(id=job_id).update(
        moved_to_dead_letter_at=moved + dt.timedelta(minutes=2)
    )
    assert get_job(job_id).status == "dead_letter"  # failed again after the replay

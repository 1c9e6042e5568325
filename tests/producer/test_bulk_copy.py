"""bulk_enqueue's paths agree: COPY against soniq_enqueue_many on PostgreSQL, the batch against
enqueue() one by one on both backends.

``COPY_MIN_JOBS`` is lowered so that small generated batches take the COPY
path (``producer/_copy.py``); a spy on its COPY says whether it ran.
"""

import datetime as dt
import math
import uuid

import pytest
from django.db import connection, transaction
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from soniq_django import bulk_enqueue, enqueue
from soniq_django.errors import ErrorCode, SoniqError
from soniq_django.models import DeadLetterJob, Job
from soniq_django.producer import _copy
from soniq_django.producer.request import JobRequest

pytestmark = pytest.mark.django_db

#: Every column but the id and the two timestamps a row gets when written.
COLUMNS = tuple(field.attname for field in Job._meta.concrete_fields
                if field.attname not in ("id", "created_at", "updated_at"))

# Text that COPY's text format has to escape (tab, newline, backslash), non-ASCII
# and astral characters; never NUL or a lone surrogate (prepare refuses both).
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00",
                             max_codepoint=0x1F600) | st.sampled_from("\t\n\\\r"), max_size=6)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | TEXT
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(TEXT, children, max_size=3),
    max_leaves=8,
)
WHEN = st.sampled_from([
    None, dt.datetime(2020, 1, 1, tzinfo=dt.UTC),
    dt.datetime(2999, 1, 2, 3, 4, 5, 678901, tzinfo=dt.timezone(dt.timedelta(hours=2)))])
IDS = [uuid.UUID("5b1b2a1c-1111-4d2d-8e3e-000000000001"),
       uuid.UUID("5b1b2a1c-1111-4d2d-8e3e-000000000002")]
REQUEST = st.builds(
    JobRequest,
    st.sampled_from(["a.b", "billing.send_invoice", "r.x"]),
    st.dictionaries(st.sampled_from(["a", "b", "é", "k\tey", "😀"]), JSON, max_size=3) | st.none(),
    queue=st.sampled_from([None, "default", "mail", "é" * 255, "tab\tback\\slash\nq"]),
    priority=st.none() | st.integers(-(2**31), 2**31 - 1),
    run_at=WHEN,
    max_attempts=st.sampled_from([4, None, 1, 2**31 - 1]),
    unique_job=st.booleans(),
    dedup_key=st.sampled_from([None, None, "k1", "k2"]),
    producer_id=st.sampled_from([None, "p1", "😀" * 3, "back\\slash"]),
    job_id=st.sampled_from([None, None, None, *IDS]),
)
BATCH = st.lists(REQUEST, max_size=8)
SLOW = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                  HealthCheck.too_slow])


@pytest.fixture
def copies(monkeypatch):
    """The sizes of the COPY loads made from now on."""
    sizes = []
    load = _copy._copy

    def spy(cursor, conn, table, jobs, producer):
        sizes.append(len(jobs))
        return load(cursor, conn, table, jobs, producer)

    monkeypatch.setattr(_copy, "_copy", spy)
    return sizes


def _rows(ids) -> tuple:
    """What ``ids`` point at: the rows in request order, which positions share a job, how many."""
    rows = {row[0]: row[1:] for row in Job.objects.values_list("id", *COLUMNS)}
    first = {}
    shape = [first.setdefault(i, n) for n, i in enumerate(ids)]
    return [rows[i] for i in ids], shape, len(rows)


def _outcome(call) -> tuple:
    """The rows ``call()`` wrote, or the code it raised; rolled back either way."""
    sid = transaction.savepoint()
    try:
        with transaction.atomic():
            ids = call()
            return ("ok", _rows(ids), [i in IDS for i in ids])
    except SoniqError as error:
        return ("error", error.code)
    finally:
        transaction.savepoint_rollback(sid)


def _with_threshold(count, call):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_copy, "COPY_MIN_JOBS", count)
        return call()


def _one_by_one(requests):
    return [enqueue(r.job_name, r.args, queue=r.queue, priority=r.priority, run_at=r.run_at,
                    max_attempts=r.max_attempts, unique_job=r.unique_job, dedup_key=r.dedup_key,
                    producer_id=r.producer_id, job_id=r.job_id) for r in requests]


@pytest.mark.postgresql_only
@settings(max_examples=60, **SLOW)
@given(requests=BATCH)
@example(requests=[JobRequest("a.b", {"t": "a\tb\\n\n"}, queue="q\\\t"),
                   JobRequest("a.b", {}, job_id=IDS[0]), JobRequest("r.x", {}, job_id=IDS[0])])
def test_copy_writes_the_rows_soniq_enqueue_many_writes(requests, copies):
    fetch_sql("SET LOCAL application_name = 'hypothesis'")
    before = len(copies)
    by_function = _with_threshold(10**9, lambda: _outcome(lambda: bulk_enqueue(requests)))
    assert len(copies) == before
    by_copy = _with_threshold(1, lambda: _outcome(lambda: bulk_enqueue(requests)))
    assert by_copy == by_function
    plain = [r for r in requests if not (r.unique_job or r.dedup_key)]
    assert copies[before:] == ([len(plain)] if plain else [])


@settings(max_examples=40, **SLOW)
@given(requests=BATCH)
def test_a_batch_writes_what_enqueue_writes_one_by_one(requests, backend):
    # On PostgreSQL the batch takes the COPY path; on SQLite its own.
    # A batch writes its plain jobs first, then resolves the unique and dedup ones
    # (soniq_django/producer/_copy.py, decision 0008): one by one differs by design
    # when a plain job names the job_id a deduplicated request named before it.
    assume(not _id_shared_across_kinds(requests))
    one_by_one = _outcome(lambda: _one_by_one(requests))
    batch = _with_threshold(1, lambda: _outcome(lambda: bulk_enqueue(requests)))
    assert batch == one_by_one


def _id_shared_across_kinds(requests) -> bool:
    """Whether a job_id is named both by a plain request and by a deduplicating one."""
    plain = {r.job_id for r in requests if r.job_id and not (r.unique_job or r.dedup_key)}
    deduplicating = {r.job_id for r in requests if r.job_id and (r.unique_job or r.dedup_key)}
    return bool(plain & deduplicating)


def fetch_sql(sql, params=()):
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def _dead_letter(job_id):
    DeadLetterJob.objects.create(id=job_id, job_name="a.dead", queue="default", args={},
                                 attempts=1, max_attempts=1, last_error="x",
                                 dead_letter_reason="permanent_failure",
                                 original_created_at=dt.datetime(2020, 1, 1, tzinfo=dt.UTC))


def _pattern_refuses_lowercase():
    database = connection.ops.quote_name(connection.settings_dict["NAME"])
    fetch_sql(f"ALTER DATABASE {database} SET soniq.task_name_pattern = '^[A-Z]+$'")


SETUPS = {
    # name: (what makes the batch fail, whether the COPY is reached, the code)
    "a job_id repeated in the batch": (lambda: None, [JobRequest("a.b", {}, job_id=IDS[0])],
                                       True, ErrorCode.DUPLICATE_JOB_ID),
    "a job_id taken by a queued job": (lambda: enqueue("a.b", {}, job_id=IDS[0]), [], True,
                                       ErrorCode.DUPLICATE_JOB_ID),
    "a job_id held by a dead letter": (lambda: _dead_letter(IDS[0]), [], False,
                                       ErrorCode.DUPLICATE_JOB_ID),
    "the database's pattern": (_pattern_refuses_lowercase, [], False,
                               ErrorCode.INVALID_TASK_NAME),
}


@pytest.mark.postgresql_only
@pytest.mark.parametrize("case", list(SETUPS))
def test_a_refused_batch_gets_the_same_code_and_writes_nothing(case, copies):
    setup, extra, copied, code = SETUPS[case]
    setup()
    existing = Job.objects.count()
    batch = [JobRequest("a.b", {"n": n}) for n in range(3)] + [
        JobRequest("a.b", {}, job_id=IDS[0]), JobRequest("a.u", {}, unique_job=True), *extra]
    found = []
    for threshold in (10**9, 1):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_copy, "COPY_MIN_JOBS", threshold)
            with pytest.raises(SoniqError) as caught:
                bulk_enqueue(batch)
        found.append(caught.value.code)
        assert Job.objects.count() == existing
    assert found == [code, code]
    assert bool(copies) is copied


@pytest.mark.postgresql_only
def test_python_validation_refuses_before_either_path(copies, monkeypatch):
    monkeypatch.setattr(_copy, "COPY_MIN_JOBS", 1)
    with pytest.raises(SoniqError) as caught:
        bulk_enqueue([JobRequest("a.b", {}), JobRequest("a.b", {"x": math.nan})])
    assert caught.value.code is ErrorCode.TASK_ARGS_INVALID
    assert not copies and not Job.objects.exists()


@pytest.mark.postgresql_only
def test_a_role_that_may_only_call_the_sql_api_gets_soniq_enqueue_many(copies, monkeypatch):
    import io

    from django.core.management import call_command

    monkeypatch.setattr(_copy, "COPY_MIN_JOBS", 1)
    fetch_sql("CREATE ROLE soniq_t17_producer_only")  # rolled back with the test
    call_command("soniq_grant", "soniq_t17_producer_only", stdout=io.StringIO())
    fetch_sql("SET LOCAL ROLE soniq_t17_producer_only")
    ids = bulk_enqueue([JobRequest("a.b", {"n": n}) for n in range(3)])
    fetch_sql("RESET ROLE")
    assert not copies
    assert Job.objects.filter(id__in=ids).count() == 3


@pytest.mark.postgresql_only
def test_the_threshold_decides_and_query_logging_turns_copy_off(copies, monkeypatch):
    from django.test.utils import CaptureQueriesContext

    monkeypatch.setattr(_copy, "COPY_MIN_JOBS", 3)
    bulk_enqueue([JobRequest("a.b", {}), JobRequest("a.b", {}),
                  JobRequest("a.k", {}, dedup_key="k")])
    assert copies == []  # two plain jobs: below the threshold
    bulk_enqueue([JobRequest("a.b", {})] * 3)
    assert copies == [3]
    with CaptureQueriesContext(connection) as captured:
        bulk_enqueue([JobRequest("a.b", {})] * 3)
    assert copies == [3] and any("soniq_enqueue_many(" in q["sql"] for q in captured)
    assert Job.objects.count() == 9


@pytest.mark.postgresql_only
@pytest.mark.django_db(transaction=True)
def test_copy_notifies_once_per_queue_that_got_a_due_job_at_commit(copies, monkeypatch):
    from tests.support.sql import raw

    monkeypatch.setattr(_copy, "COPY_MIN_JOBS", 1)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    with raw() as listener:
        listener.execute("LISTEN soniq_new_job")
        keyed = enqueue("m.k", {}, queue="dup", dedup_key="kk")
        assert [n.payload for n in listener.notifies(timeout=5, stop_after=1)] == ["dup"]
        with transaction.atomic():
            ids = bulk_enqueue([
                JobRequest("a.b", {}, queue="a"), JobRequest("a.b", {}, queue="a"),
                JobRequest("a.b", {}, queue="b", run_at=later - dt.timedelta(hours=2)),
                JobRequest("a.b", {}, queue="later", run_at=later),
                JobRequest("a.b", {}, queue="later", run_at=later + dt.timedelta(hours=1)),
                JobRequest("a.u", {}, queue="u", unique_job=True),
                JobRequest("a.u", {}, queue="u", unique_job=True),
                JobRequest("a.k", {}, queue="dup", dedup_key="kk"),
            ])
            assert list(listener.notifies(timeout=0.3)) == []  # not before the commit
        got = [n.payload for n in listener.notifies(timeout=5, stop_after=3)]
        got += [n.payload for n in listener.notifies(timeout=0.5)]
    assert copies == [5] and ids[-1] == keyed
    assert sorted(got) == ["a", "b", "u"]


def _large_batch(count):
    """``count`` plain requests over a few queues, priorities, times, limits and producers."""
    at = [None, dt.datetime(2020, 1, 1, tzinfo=dt.UTC),
          dt.datetime(2999, 1, 2, 3, 4, 5, 678901, tzinfo=dt.timezone(dt.timedelta(hours=-5)))]
    return [JobRequest("a.b", {"n": n, "s": "t\\\tx" * (n % 2)}, queue=["q", "r\\s", "é"][n % 3],
                       priority=n % 5, run_at=at[n % len(at)], max_attempts=[4, None][n % 2],
                       producer_id=[None, "p\tq"][n % 4 == 0])
            for n in range(count)]


@pytest.mark.postgresql_only
def test_a_batch_of_many_blocks_writes_the_rows_soniq_enqueue_many_writes(copies):
    # More rows than one block (_copy.ROWS_PER_WRITE), with more than one line head.
    requests = _large_batch(2 * _copy.ROWS_PER_WRITE + 7)
    by_function = _with_threshold(10**9, lambda: _outcome(lambda: bulk_enqueue(requests)))
    by_copy = _with_threshold(1, lambda: _outcome(lambda: bulk_enqueue(requests)))
    assert copies == [len(requests)]
    assert by_copy[0] == "ok" and by_copy == by_function


@pytest.mark.postgresql_only
@pytest.mark.parametrize("position", ["first", "last"])
def test_a_taken_id_anywhere_in_a_batch_of_many_blocks_is_duplicate_job_id(position, copies):
    # The server refuses the row while later blocks are still being written.
    taken = enqueue("a.b", {})
    requests = _large_batch(3 * _copy.ROWS_PER_WRITE)
    index = 0 if position == "first" else -1
    requests[index] = JobRequest("a.b", {}, job_id=taken)
    with pytest.raises(SoniqError) as caught:
        _with_threshold(1, lambda: bulk_enqueue(requests))
    assert caught.value.code is ErrorCode.DUPLICATE_JOB_ID
    assert copies == [len(requests)] and Job.objects.count() == 1

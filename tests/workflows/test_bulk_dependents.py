"""bulk_enqueue with depends_on is set-based: a few statements for the whole bulk.

Both databases (soniq_enqueue_after_many of sql/producer_api_v6.sql on
PostgreSQL, its twin in producer/dependencies.py on SQLite):

- the statements a bulk of waiting jobs makes do not grow with the bulk;
- a property test: for random lists of waiting jobs -- naming done, queued,
  cancelled and dead-lettered jobs and earlier jobs of the list, waiting
  for any outcome or not -- one bulk call writes exactly what one enqueue
  per job, in order, writes: statuses, last errors, held times, marks,
  edges and waits rows;
- an unknown dependency anywhere refuses the whole bulk, free jobs
  included; a job of the bulk may name an earlier one, never a later one;
- a unique job that finds its equal queued keeps the rules of one enqueue.
"""

import dataclasses
import datetime as dt
import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, given, settings, strategies as st

from soniq_django import JobRequest, bulk_enqueue, enqueue, job
from soniq_django.errors import ConfigValidationError, ErrorCode
from soniq_django.models import (WAITING_SCHEDULED_AT, DeadLetterJob, Job, JobDependency,
                                 JobWait)
from soniq_django.owned import OwnedJobSource
from soniq_django.producer.api import insert_many_prepared, insert_prepared
from soniq_django.producer.request import prepare_all
from tests.support.owned import nonce

pytestmark = pytest.mark.django_db(transaction=True)


@job(name="wfm.step")
def step(n: int = 0) -> int:
    return n


def claim_all(source: OwnedJobSource) -> dict[uuid.UUID, object]:
    claimed = {}
    while (got := source.claim_next_owned("wfm-worker", claim_token=nonce())) is not None:
        claimed[uuid.UUID(str(got.job_id))] = got
    return claimed


def finish(source: OwnedJobSource, job_id: uuid.UUID) -> None:
    """Complete ``job_id``; every other job claimed meanwhile goes back untouched."""
    claimed = claim_all(source)
    assert source.complete_owned(claimed.pop(job_id).claim_fence) is True
    for other in claimed.values():
        assert source.defer_owned(other.claim_fence, "test") is True


def test_the_statements_of_a_bulk_do_not_grow_with_it():
    root = enqueue("wfm.step")

    def statements(size: int) -> int:
        requests = [JobRequest("wfm.step", {"n": n}, depends_on=[root]) for n in range(size)]
        with CaptureQueriesContext(connection) as captured:
            bulk_enqueue(requests)
        return len(captured.captured_queries)

    # One enqueue per job made 4 or more statements a job; here a bulk's rows are written
    # by multi-row statements (SQLite: Django splits a large one by its parameter limit).
    few, many = statements(5), statements(200)
    assert many <= few + 10, (few, many)
    if connection.vendor == "postgresql":
        with CaptureQueriesContext(connection) as captured:
            bulk_enqueue([JobRequest("wfm.step", depends_on=[root]) for _ in range(30)])
        calls = [q["sql"] for q in captured.captured_queries if "soniq_enqueue_after" in q["sql"]]
        assert len(calls) == 1 and "soniq_enqueue_after_many" in calls[0]
    assert JobWait.objects.count() == 205 + (30 if connection.vendor == "postgresql" else 0)


def test_an_unknown_dependency_anywhere_refuses_the_whole_bulk():
    root = enqueue("wfm.step")
    before = Job.objects.count()
    with pytest.raises(ConfigValidationError) as raised:
        bulk_enqueue([JobRequest("wfm.step"),
                      JobRequest("wfm.step", depends_on=[root]),
                      JobRequest("wfm.step", depends_on=[root, uuid.uuid4()])])
    assert raised.value.code == ErrorCode.UNKNOWN_DEPENDENCY
    assert Job.objects.count() == before
    assert not JobDependency.objects.exists() and not JobWait.objects.exists()
    assert Job.objects.get(id=root).has_dependents is None  # the mark rolled back too


def test_a_job_of_the_bulk_may_name_earlier_ones_and_runs_after_them():
    source = OwnedJobSource()
    a, b, c = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    ids = bulk_enqueue([JobRequest("wfm.step", job_id=a),
                        JobRequest("wfm.step", job_id=b, depends_on=[a]),
                        JobRequest("wfm.step", job_id=c, depends_on=[b, a])])
    assert ids == [a, b, c]
    assert JobWait.objects.get(job_id=b).pending == 1
    assert JobWait.objects.get(job_id=c).pending == 2
    assert Job.objects.get(id=b).has_dependents is True
    assert set(claim_all_and_put_back(source)) == {a}
    finish(source, a)
    assert set(claim_all_and_put_back(source)) == {b}
    finish(source, b)
    assert set(claim_all_and_put_back(source)) == {c}
    with pytest.raises(ConfigValidationError) as raised:  # a later one: no cycle
        bulk_enqueue([JobRequest("wfm.step", job_id=uuid.uuid4(), depends_on=[c]),
                      JobRequest("wfm.step", depends_on=[later := uuid.uuid4()]),
                      JobRequest("wfm.step", job_id=later, depends_on=[c])])
    assert raised.value.code == ErrorCode.UNKNOWN_DEPENDENCY


def claim_all_and_put_back(source: OwnedJobSource) -> set[uuid.UUID]:
    claimed = claim_all(source)
    for other in claimed.values():
        assert source.defer_owned(other.claim_fence, "test") is True
    return set(claimed)


def test_a_failed_dependency_cancels_down_the_bulk_at_once():
    source = OwnedJobSource()
    gone = enqueue("wfm.step")
    assert source.request_cancel(gone)
    a, b = uuid.uuid4(), uuid.uuid4()
    bulk_enqueue([JobRequest("wfm.step", job_id=a, depends_on=[gone]),
                  JobRequest("wfm.step", job_id=b, depends_on=[a])])
    rows = {row.id: row for row in Job.objects.filter(id__in=[a, b])}
    assert rows[a].status == rows[b].status == "cancelled"
    assert rows[a].last_error == f"dependency_failed:{gone}"
    assert rows[b].last_error == f"dependency_failed:{a}"
    assert rows[a].scheduled_at is None and not JobWait.objects.exists()


def test_a_unique_job_that_finds_its_equal_keeps_one_enqueues_rules():
    root = enqueue("wfm.step")
    first = enqueue("wfm.step", {"n": 1}, unique_job=True)
    named = uuid.uuid4()
    [found] = bulk_enqueue([JobRequest("wfm.step", {"n": 1}, unique_job=True, depends_on=[root])])
    assert found == first
    assert not JobDependency.objects.filter(job_id=first).exists()
    with pytest.raises(ConfigValidationError) as raised:
        bulk_enqueue([JobRequest("wfm.step", {"n": 1}, unique_job=True, job_id=named,
                                 depends_on=[root]),
                      JobRequest("wfm.step", depends_on=[named])])
    assert raised.value.code == ErrorCode.UNKNOWN_DEPENDENCY


# The property: one bulk call writes what one enqueue per job writes. ---------------------

OUTSIDE = ("done", "queued", "cancelled", "dead_letter")

element = st.fixed_dictionaries({
    "outside": st.lists(st.sampled_from(OUTSIDE), max_size=3, unique=True),
    "earlier": st.lists(st.integers(min_value=0, max_value=5), max_size=3, unique=True),
    "any_outcome": st.booleans(),
    "later": st.booleans(),
})


def _outside_jobs() -> dict[str, uuid.UUID]:
    """One job in each state a dependency can be in."""
    source, queue = OwnedJobSource(), f"outside-{uuid.uuid4().hex[:12]}"
    made = {name: enqueue("wfm.step", {"outside": name}, queue=queue) for name in OUTSIDE}
    claimed = {}
    while (got := source.claim_next_owned("wfm-worker", claim_token=nonce(),
                                          queues=[queue])) is not None:
        claimed[uuid.UUID(str(got.job_id))] = got
    assert source.complete_owned(claimed.pop(made["done"]).claim_fence) is True
    assert source.fail_owned(claimed.pop(made["dead_letter"]).claim_fence, "boom",
                             retry=False) is True
    for other in claimed.values():
        assert source.defer_owned(other.claim_fence, "test") is True
    assert source.request_cancel(made["cancelled"])
    assert DeadLetterJob.objects.filter(id=made["dead_letter"]).exists()
    return made


def _prepared(plan: list[dict], outside: dict[str, uuid.UUID]):
    ids = [uuid.uuid4() for _ in plan]
    requests = []
    for index, part in enumerate(plan):
        deps = [outside[name] for name in part["outside"]]
        deps += [ids[n] for n in part["earlier"] if n < index]
        run_at = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc) if part["later"] else None
        requests.append(JobRequest("wfm.step", {"n": index}, job_id=ids[index],
                                   depends_on=deps, run_at=run_at))
    prepared = [dataclasses.replace(job, any_outcome=part["any_outcome"])
                for job, part in zip(prepare_all(requests), plan)]
    return ids, prepared


def _written(ids: list[uuid.UUID], outside: dict[str, uuid.UUID]) -> list[tuple]:
    """What was written for each job, with ids as names (``o:done``, ``b:2``)."""
    names = {job_id: f"b:{n}" for n, job_id in enumerate(ids)}
    names.update({job_id: f"o:{name}" for name, job_id in outside.items()})

    def named(text):
        for job_id, name in names.items():
            text = text.replace(str(job_id), name) if text else text
        return text

    rows = {row.id: row for row in Job.objects.filter(id__in=ids)}
    waits = {row.job_id: row for row in JobWait.objects.filter(job_id__in=ids)}
    edges = {}
    for edge in JobDependency.objects.filter(job_id__in=ids):
        edges.setdefault(edge.job_id, []).append((names[edge.depends_on], edge.state,
                                                  edge.any_outcome))
    marks = {name: Job.objects.filter(id=outside[name]).values_list(
        "has_dependents", flat=True).first() for name in ("queued",)}
    return [marks] + [
        (rows[job_id].status, named(rows[job_id].last_error),
         rows[job_id].scheduled_at == WAITING_SCHEDULED_AT, rows[job_id].scheduled_at is None,
         rows[job_id].has_dependents,
         None if job_id not in waits else (waits[job_id].pending,
                                           waits[job_id].run_at is None),
         sorted(edges.get(job_id, [])))
        for job_id in ids]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=st.lists(element, min_size=1, max_size=6))
def test_one_bulk_writes_what_one_enqueue_per_job_writes(plan):
    from django.db import router

    alias = router.db_for_write(Job)
    outside = _outside_jobs()
    bulk_ids, prepared = _prepared(plan, outside)
    assert insert_many_prepared(prepared, alias) == bulk_ids
    by_bulk = _written(bulk_ids, outside)

    outside = _outside_jobs()
    one_ids, prepared = _prepared(plan, outside)
    assert [insert_prepared(job, alias) for job in prepared] == one_ids
    assert _written(one_ids, outside) == by_bulk


# The SQL API: soniq_enqueue_after_many (PostgreSQL). --------------------------------------

def _sql_error(query: str, params: list):
    from django.db import DatabaseError

    with pytest.raises(DatabaseError) as raised, connection.cursor() as cursor:
        cursor.execute(query, params)
    return raised.value.__cause__.diag


@pytest.mark.postgresql_only
def test_the_sql_api_enqueues_many_after():
    import json

    source = OwnedJobSource()
    root = enqueue("wfm.step")
    a = uuid.uuid4()
    with connection.cursor() as cursor:
        cursor.execute("SELECT soniq_enqueue_after_many(%s::jsonb)", [json.dumps([
            {"job_name": "wfm.step", "job_id": str(a), "depends_on": [str(root)]},
            {"job_name": "wfm.step", "args": {"n": 2}, "depends_on": [str(a), str(root)],
             "any_outcome": True}])])
        (ids,) = cursor.fetchone()
    assert ids[0] == a and len(ids) == 2
    assert JobWait.objects.get(job_id=ids[1]).pending == 2
    assert JobDependency.objects.filter(job_id=ids[1], any_outcome=True).count() == 2
    finish(source, root)
    assert set(claim_all_and_put_back(source)) == {a}


@pytest.mark.postgresql_only
@pytest.mark.parametrize("element", [
    {"job_name": "wfm.step"},  # depends_on is required
    {"job_name": "wfm.step", "depends_on": "x"},
    {"job_name": "wfm.step", "depends_on": [1]},
    {"job_name": "wfm.step", "depends_on": [], "any_outcome": "yes"},
])
def test_the_sql_api_refuses_a_bad_depends_on_naming_the_element(element):
    import json

    diag = _sql_error("SELECT soniq_enqueue_after_many(%s::jsonb)",
                      [json.dumps([{"job_name": "wfm.step", "depends_on": []}, element])])
    assert (diag.sqlstate, diag.message_hint) == ("22023", "SONIQ_INVALID_OPTION")
    assert diag.message_detail == "jobs element 2 (counting from 1)"
    assert not Job.objects.exists()


@pytest.mark.postgresql_only
def test_the_sql_api_refuses_an_unknown_dependency_naming_the_element():
    import json

    diag = _sql_error("SELECT soniq_enqueue_after_many(%s::jsonb)", [json.dumps([
        {"job_name": "wfm.step", "depends_on": []},
        {"job_name": "wfm.step", "depends_on": [str(uuid.uuid4())]}])])
    assert (diag.sqlstate, diag.message_hint) == ("22023", "SONIQ_UNKNOWN_DEPENDENCY")
    assert diag.message_detail == "jobs element 2 (counting from 1)"
    assert not Job.objects.exists()

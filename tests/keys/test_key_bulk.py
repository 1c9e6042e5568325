"""Gap 4 of issue 31: a bulk enqueue of keyed jobs is set-based, and writes exactly what
one enqueue per job writes.

``bulk_enqueue`` hands its keyed jobs to ``write_keyed_many``: one call of
``soniq_enqueue_keyed_many`` on PostgreSQL, a few statements per list and per key on
SQLite. The property: from the same starting state (keys with running, offered and
parked jobs), one bulk of random keyed jobs (keys, limits, priorities, due now, past or
later, unique twins) leaves the job rows, the keys' rows and the parked rows exactly as
one ``enqueue`` per job does (each job by its rank in its key: see ``_state``), in the
order a bulk writes its jobs (every bulk, keyed or
not, writes the jobs that cannot have a twin first, then the unique ones, each in
order). Both databases.
"""

import datetime as dt
import uuid

import pytest
from django.db import connection, transaction
from django.utils import timezone
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from soniq_django import JobRequest, bulk_enqueue, enqueue
from soniq_django.errors import ConfigValidationError, ErrorCode
from soniq_django.keys.models import KeyParked, KeySlot
from soniq_django.models import Job
from soniq_django.owned import OwnedJobSource
from tests.support.owned import nonce

pytestmark = pytest.mark.django_db

#: A job: (key, limit, rate, priority, when (None, past, soon, later), n for its args, unique)
SPEC = st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from([None, 1, 2]),
                 st.sampled_from([None, "3/m"]), st.sampled_from([50, 100]),
                 st.sampled_from([None, -3600, 1800, 3600]), st.integers(0, 3), st.booleans())


class _Undo(Exception):
    pass


def _request(spec, job_id, now, index):
    """The job; its run_at ``index`` ms apart from any other's: a key's jobs due at the very
    same time are offered in an order neither way of enqueueing promises."""
    key, limit, rate, priority, when, n, unique = spec
    return JobRequest("keys.bulk", {"n": n}, priority=priority, unique_job=unique,
                      run_at=None if when is None
                      else now + dt.timedelta(seconds=when, milliseconds=index),
                      concurrency_key=key, key_concurrency=limit, key_rate=rate,
                      job_id=job_id)


def _state(now):
    """The rows, each job by its rank in its key (its priority, and its due time or due
    now): the two ways stamp created_at apart (a bulk's plain jobs share one), so which of
    two due jobs of equal priority a key offers may differ; which rank it offers may not."""
    rows = {row[0]: row[1:] for row in Job.objects.values_list(
        "id", "concurrency_key", "status", "scheduled_at", "priority", "created_at")}
    due = dict(KeyParked.objects.values_list("job_id", "run_at"))
    slots = {}
    for s in KeySlot.objects.all():
        if s.head is not None:
            due[s.head] = s.head_run_at
        slots[(s.queue, s.key)] = (s.running, s.head is not None, s.configured_concurrency,
                                   s.configured_rate_limit, s.configured_rate_period)

    def rank(job_id):
        key, status, _, priority, _ = rows[job_id]
        when = due.get(job_id)
        return (key, status, priority, (0, now) if when is None or when <= now else (1, when))

    jobs = sorted((rank(job_id), rows[job_id][2] is not None
                   and rows[job_id][2].year == 9999) for job_id in rows)
    offered = sorted(rank(s.head) for s in KeySlot.objects.exclude(head=None))
    return jobs, slots, offered


def _after(before, claims, specs, ids, now, bulk):
    """The state after ``before`` (enqueued one by one), ``claims`` claims, then ``specs``
    enqueued by one bulk or one call each; rolled back."""
    found = {}
    try:
        with transaction.atomic():
            for index, (spec, job_id) in enumerate(before):
                enqueue(**_kwargs(_request(spec, job_id, now, index)))
            if claims:
                OwnedJobSource().claim_many_owned("w-1", claim_tokens=[
                    nonce() for _ in range(claims)])
            requests = [_request(spec, job_id, now, len(before) + index)
                        for index, (spec, job_id) in enumerate(zip(specs, ids))]
            if bulk:
                found["ids"] = bulk_enqueue(requests)
            else:
                # In the order a bulk writes its jobs (as bulk_enqueue of plain jobs does):
                # those that cannot find a twin first, then the unique ones, each in order.
                order = sorted(range(len(requests)), key=lambda i: requests[i].unique_job)
                written = {i: enqueue(**_kwargs(requests[i])) for i in order}
                found["ids"] = [written[i] for i in range(len(requests))]
            found["state"] = _state(now)
            raise _Undo
    except _Undo:
        pass
    return found["ids"], found["state"]


def _kwargs(request):
    return dict(job_name=request.job_name, args=request.args, priority=request.priority,
                unique_job=request.unique_job, run_at=request.run_at,
                concurrency_key=request.concurrency_key,
                key_concurrency=request.key_concurrency, key_rate=request.key_rate,
                job_id=request.job_id)


@hsettings(max_examples=40, deadline=None, print_blob=True,
           suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(before=st.lists(SPEC, max_size=5), claims=st.integers(0, 3),
       specs=st.lists(SPEC, min_size=1, max_size=10),
       limits=st.fixed_dictionaries({key: st.tuples(st.sampled_from([None, 1, 2]),
                                                     st.sampled_from([None, "3/m"]))
                                     for key in "abc"}))
def test_one_bulk_writes_what_one_enqueue_per_job_writes(before, claims, specs, limits):
    # A key's limits are the same in every job of an example: a limit a bulk changes applies
    # at its key's admission, after all its jobs are written, where one call per job leaves
    # an already offered job in place until the next (docs/keys.md).
    before = [(spec[0], *limits[spec[0]], *spec[3:]) for spec in before]
    specs = [(spec[0], *limits[spec[0]], *spec[3:]) for spec in specs]
    now = timezone.now()
    before = [(spec, uuid.uuid4()) for spec in before]
    ids = [uuid.uuid4() for _ in specs]
    bulk_ids, (jobs, slots, offered) = _after(before, claims, specs, ids, now, bulk=True)
    one_ids, (one_jobs, one_slots, one_offered) = _after(before, claims, specs, ids, now,
                                                         bulk=False)
    assert bulk_ids == one_ids
    assert (jobs, offered) == (one_jobs, one_offered)
    # The keys' counts and offered jobs as one call per job leaves them; their configured
    # limits are the last new job's of each key in the bulk's own order (one call per job
    # in the write order would leave the last unique job's).
    assert {k: v[:2] for k, v in slots.items()} == {k: v[:2] for k, v in one_slots.items()}
    declared = {}
    for spec, job_id, found in zip(specs, ids, bulk_ids):
        if found == job_id:
            key, limit, rate, *_ = spec
            count, period = (None, None) if rate is None else (3, 60)
            declared[("default", key)] = (limit, count, period)
    for key, row in slots.items():
        if key in declared:
            assert row[2:] == declared[key]
        else:
            assert row[2:] == one_slots[key][2:]


def test_a_bulk_of_keyed_jobs_is_one_call_on_postgresql(django_assert_max_num_queries):
    requests = [JobRequest("keys.bulk", {"n": n}, concurrency_key=f"k{n % 7}",
                           key_concurrency=1) for n in range(200)]
    # One call (PostgreSQL) or a few statements per key (SQLite), not one per job.
    limit = 4 if connection.vendor == "postgresql" else 120
    with django_assert_max_num_queries(limit):
        ids = bulk_enqueue(requests)
    assert len(set(ids)) == 200
    assert KeySlot.objects.exclude(head=None).count() == 7
    assert KeyParked.objects.count() == 200 - 7


def test_a_bad_key_option_in_a_bulk_writes_nothing():
    requests = [JobRequest("keys.bulk", {"n": 1}, concurrency_key="k"),
                JobRequest("keys.bulk", {"n": 2}, concurrency_key="k", key_rate="fast")]
    with pytest.raises(ConfigValidationError) as error, transaction.atomic():
        bulk_enqueue(requests)
    assert error.value.code == ErrorCode.INVALID_OPTION
    assert not Job.objects.exists() and not KeySlot.objects.exists()


@pytest.mark.postgresql_only
def test_the_sql_function_checks_every_element_first():
    from django.db import DatabaseError

    with connection.cursor() as cursor:
        with pytest.raises(DatabaseError) as error, transaction.atomic():
            cursor.execute("SELECT soniq_enqueue_keyed_many(%s::jsonb)", [
                '[{"job_name": "keys.bulk", "concurrency_key": "k"},'
                ' {"job_name": "keys.bulk", "concurrency_key": "k", "key_concurrency": 0}]'])
        cause = error.value.__cause__
        assert (cause.sqlstate, cause.diag.message_hint, cause.diag.message_detail) == (
            "22023", "SONIQ_INVALID_OPTION", "element 2 of jobs")
        cursor.execute("SELECT soniq_enqueue_keyed_many(%s::jsonb)", [
            '[{"job_name": "keys.bulk", "concurrency_key": "k", "key_concurrency": 1,'
            '  "key_rate": "2/s"}, {"job_name": "keys.bulk", "concurrency_key": "k"}]'])
        (found,) = cursor.fetchone()
    assert len(found) == 2 and Job.objects.filter(concurrency_key="k").count() == 2
    slot = KeySlot.objects.get(key="k")
    assert (slot.configured_concurrency, slot.configured_rate_limit) == (None, None)
    assert slot.head == found[0]

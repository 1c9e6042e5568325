"""The SQLite twin's claim does not read the backlogs it does not serve (decision 0029).

The twin of tests/sql/test_sql_claim_backlog_cost.py. Before claim protocol
v8 the twin found the next jobs with one query over every queued job (the
queues held back excluded by a filter, a scheduled job due or not by an OR),
which SQLite answered by reading the whole table and sorting it: 100,000
queued jobs of a paused queue were read by every claim of the other queues,
and so was every backlog by every claim. Now each scan reads one index in
its order with a limit, as on PostgreSQL. The work is counted in SQLite
virtual-machine steps (a progress handler called every 10 steps) around the
claim; 100,000 rows read would be millions. The backlog is loaded once for
the module (committed; each test's own rows are rolled back). SQLite only:
PostgreSQL's plans are read with EXPLAIN in the twin test.
"""

import datetime as dt
import uuid

import pytest
from django.db import connection
from django.utils import timezone

from soniq_django import enqueue
from soniq_django.models import QueueHold, QueueSetting
from soniq_django.owned import OwnedJobSource
from tests.support.owned import nonce

pytestmark = [pytest.mark.sqlite_only, pytest.mark.django_db]

HELD = 100_000
#: Steps a claim may take here, as counted: version 8's took 280 to 460, version 7's
#: 0.7 to 1.3 million (but a few hundred for a claim that names its queues).
MOST_STEPS = 20_000


@pytest.fixture(scope="module")
def backlog(django_db_setup, django_db_blocker):
    """HELD queued jobs of the queue 'held', enqueued before anything else."""
    with django_db_blocker.unblock():
        load("held", HELD)
    yield
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM soniq_jobs WHERE queue = 'held'")


def load(queue, count, created_at="2020-01-01 00:00:00"):
    with connection.cursor() as cursor:
        cursor.execute(
            "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < %s) "
            "INSERT INTO soniq_jobs (id, job_name, args, queue, status, priority, created_at, "
            "updated_at, attempts, max_attempts, claim_generation, fence_required, "
            "cancel_requested, unique_job) "
            "SELECT lower(hex(randomblob(16))), 'cost.held', '{}', %s, 'queued', 100, %s, %s, "
            "0, 4, 0, 0, 0, 0 FROM g", [count, queue, created_at, created_at])


def steps(call):
    """``call()``'s result and the SQLite VM steps it took (in tens, rounded down)."""
    counted = [0]

    def tick():
        counted[0] += 1
        return 0

    connection.ensure_connection()
    connection.connection.set_progress_handler(tick, 10)
    try:
        result = call()
    finally:
        connection.connection.set_progress_handler(None, 10)
    return result, counted[0] * 10


SCENARIOS = {
    "paused": lambda: QueueSetting.objects.create(queue="held", paused=True),
    "budget 0": lambda: (
        QueueSetting.objects.create(queue="held", concurrency=1),
        QueueHold.objects.create(job_id=uuid.uuid4(), generation=1,
                                 queue="held", claim_owner="w",
                                 lease_expires_at=timezone.now() + dt.timedelta(hours=1))),
    "paused, limited empty": lambda: (
        QueueSetting.objects.create(queue="held", paused=True),
        QueueSetting.objects.create(queue="api", concurrency=2)),
    "not named": lambda: None,
    # Nothing held back, every queue served: the claim reads the first jobs only.
    "nothing held back": lambda: None,
}


@pytest.mark.parametrize("analyzed", [False, True], ids=["no statistics", "analyzed"])
@pytest.mark.parametrize("scheduled", [False, True], ids=["nothing scheduled", "one due"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_a_claim_reads_none_of_a_backlog_it_does_not_serve(backlog, scenario, scheduled,
                                                           analyzed):
    SCENARIOS[scenario]()
    ready = enqueue("cost.ready")
    for n in range(20):
        enqueue("cost.ready", {"n": n})
    if scheduled:
        enqueue("cost.due", priority=200, run_at=timezone.now() - dt.timedelta(minutes=1))
    if analyzed:
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    queues = ["default", "other"] if scenario == "not named" else None
    if scenario == "nothing held back":
        ready = None  # the backlog itself comes first
    claimed, taken = steps(lambda: OwnedJobSource().claim_many_owned(
        "cost-w", claim_tokens=[nonce()], queues=queues))
    assert len(claimed) == 1 and (ready is None or claimed[0].job_id == ready)
    assert taken < MOST_STEPS, taken

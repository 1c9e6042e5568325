"""Concurrent producers and the soniq_new_job notification, with real connections.

Each producer is its own psycopg connection to the test database. A race is
made real, not hoped for: the first producer enqueues and keeps its
transaction open; the second producer's enqueue starts in another thread and
must be seen waiting on a lock (pg_stat_activity) before the first commits.
"""

import threading
import time
import uuid

import psycopg
import pytest
from psycopg import IsolationLevel

from tests.support.sql import raw

pytestmark = [
    # SQL functions on raw connections, no Django code in the path: the Django 5.2 passes
    # run them (version_independent).
    pytest.mark.version_independent,
    pytest.mark.postgresql_only,
    pytest.mark.django_db,  # sets the test database up; the raw connections below commit
    pytest.mark.usefixtures("committed_db"),
]

# (first producer's call, second producer's call): each pair must resolve to one job.
RACES = {
    "unique_job": (
        "SELECT soniq_enqueue('race.build', '{\"day\": \"d\", \"n\": [1, 2]}', unique_job => true)",
        "SELECT soniq_enqueue('race.build', '{\"n\": [1, 2], \"day\": \"d\"}', unique_job => true)",
    ),
    "dedup_key": (
        "SELECT soniq_enqueue('race.a', '{\"x\": 1}', dedup_key => 'race-key')",
        "SELECT soniq_enqueue('race.b', '{\"y\": 2}', queue => 'other', dedup_key => 'race-key')",
    ),
    "unique_job_and_same_key": (
        "SELECT soniq_enqueue('race.c', '{}', unique_job => true, dedup_key => 'k1')",
        "SELECT soniq_enqueue('race.c', '{}', unique_job => true, dedup_key => 'k1')",
    ),
    "unique_job_other_key": (
        "SELECT soniq_enqueue('race.c', '{}', unique_job => true, dedup_key => 'k1')",
        "SELECT soniq_enqueue('race.c', '{}', unique_job => true, dedup_key => 'k2')",
    ),
}


def _jobs(conn) -> list[uuid.UUID]:
    return [row[0] for row in conn.execute("SELECT id FROM soniq_jobs ORDER BY created_at")]


def _wait_until_blocked(monitor, pid, thread, timeout=10.0):
    """Return once backend ``pid`` waits on a lock; fail if it finished or never does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        (wait,) = monitor.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]
        ).fetchone()
        if wait == "Lock":
            return
        assert thread.is_alive(), "the second producer finished without waiting for the first"
        time.sleep(0.01)
    raise AssertionError("the second producer never waited on the first one's lock")


class _Producer(threading.Thread):
    """Runs one call in its own transaction at an isolation level, on its own connection."""

    def __init__(self, conn, sql):
        super().__init__(daemon=True)
        self.conn, self.sql = conn, sql
        self.result = self.error = None

    def run(self):
        try:
            with self.conn.transaction():
                self.result = self.conn.execute(self.sql).fetchone()[0]
        except psycopg.Error as exc:
            self.error = exc


def _race(first_sql, second_sql, isolation, *, first_commits=True):
    """First enqueues and holds; second (at ``isolation``) starts and blocks; first ends."""
    with raw(autocommit=False) as first, raw() as second, raw() as monitor:
        second.isolation_level = isolation
        first_id = first.execute(first_sql).fetchone()[0]
        producer = _Producer(second, second_sql)
        producer.start()
        _wait_until_blocked(monitor, second.info.backend_pid, producer)
        if first_commits:
            first.commit()
        else:
            first.rollback()
        producer.join(10)
        assert not producer.is_alive()
        return first_id, producer, _jobs(monitor)


@pytest.mark.parametrize("race", list(RACES))
def test_read_committed_racers_both_get_the_one_job(race):
    first_id, second, jobs = _race(*RACES[race], IsolationLevel.READ_COMMITTED)
    assert second.error is None
    assert second.result == first_id
    assert jobs == [first_id]


@pytest.mark.parametrize("race", list(RACES))
def test_read_committed_racer_inserts_when_the_first_rolls_back(race):
    first_id, second, jobs = _race(
        *RACES[race], IsolationLevel.READ_COMMITTED, first_commits=False
    )
    assert second.error is None
    assert second.result != first_id
    assert jobs == [second.result]


@pytest.mark.parametrize("isolation", [IsolationLevel.REPEATABLE_READ, IsolationLevel.SERIALIZABLE])
@pytest.mark.parametrize("race", list(RACES))
def test_a_snapshot_racer_gets_a_serialization_failure(race, isolation):
    first_id, second, jobs = _race(*RACES[race], isolation)
    assert second.result is None
    assert second.error is not None and second.error.sqlstate == "40001"
    assert jobs == [first_id]
    # Retrying the whole transaction, as one does for 40001, returns the job.
    with raw() as retry:
        retry.isolation_level = isolation
        with retry.transaction():
            assert retry.execute(RACES[race][1]).fetchone()[0] == first_id


@pytest.mark.parametrize("isolation", [IsolationLevel.REPEATABLE_READ, IsolationLevel.SERIALIZABLE])
@pytest.mark.parametrize("race", list(RACES))
def test_a_duplicate_committed_after_the_snapshot_is_a_serialization_failure(race, isolation):
    first_sql, second_sql = RACES[race]
    with raw() as first, raw() as second:
        second.isolation_level = isolation
        with pytest.raises(psycopg.Error) as caught, second.transaction():
            second.execute("SELECT 1")  # takes the snapshot
            first.execute(first_sql)  # commits (autocommit) after it
            second.execute(second_sql)
        assert caught.value.sqlstate == "40001"
        assert len(_jobs(first)) == 1


@pytest.mark.parametrize("isolation", [IsolationLevel.REPEATABLE_READ, IsolationLevel.SERIALIZABLE])
@pytest.mark.parametrize("race", list(RACES))
def test_a_duplicate_committed_before_the_snapshot_is_returned(race, isolation):
    first_sql, second_sql = RACES[race]
    with raw() as first, raw() as second:
        first_id = first.execute(first_sql).fetchone()[0]
        second.isolation_level = isolation
        with second.transaction():
            assert second.execute(second_sql).fetchone()[0] == first_id


def test_many_concurrent_producers_make_one_job():
    sql = RACES["unique_job"][0]
    barrier = threading.Barrier(8)
    results, errors = [], []

    def produce():
        try:
            with raw() as conn:
                barrier.wait()
                results.append(conn.execute(sql).fetchone()[0])
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=produce) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert errors == [] and len(results) == 8
    assert len(set(results)) == 1
    with raw() as conn:
        assert _jobs(conn) == results[:1]


# --------------------------------------------------------------------------
# NOTIFY soniq_new_job


def _notes(listener, timeout, *, expect=0):
    """Notifications received: the ``expect`` first ones (waiting up to 5 s), then any
    arriving within ``timeout`` seconds more."""
    got = []
    if expect:
        got += [(n.channel, n.payload) for n in listener.notifies(timeout=5, stop_after=expect)]
    got += [(n.channel, n.payload) for n in listener.notifies(timeout=timeout)]
    return got


@pytest.fixture
def listener():
    with raw() as conn:
        conn.execute("LISTEN soniq_new_job")
        yield conn


def test_the_queue_name_is_notified_at_commit(listener):
    with raw(autocommit=False) as producer:
        producer.execute("SELECT soniq_enqueue('mail.send', '{}', queue => 'mail-é')")
        assert _notes(listener, 0.3) == []  # nothing before commit
        producer.commit()
    assert _notes(listener, 0.2, expect=1) == [("soniq_new_job", "mail-é")]


def test_the_default_queue_is_notified(listener):
    with raw() as producer:
        producer.execute("SELECT soniq_enqueue('mail.send', '{}')")
    assert _notes(listener, 0.2, expect=1) == [("soniq_new_job", "default")]


def test_nothing_is_notified_on_rollback(listener):
    with raw(autocommit=False) as producer:
        producer.execute("SELECT soniq_enqueue('mail.send', '{}', queue => 'mail')")
        producer.rollback()
    assert _notes(listener, 0.5) == []
    with raw() as producer:
        assert producer.execute("SELECT count(*) FROM soniq_jobs").fetchone()[0] == 0


def test_a_job_scheduled_for_later_wakes_nobody_now(listener):
    with raw() as producer:
        producer.execute(
            "SELECT soniq_enqueue('mail.send', '{}', queue => 'later', "
            "run_at => now() + interval '1 hour')"
        )
        producer.execute(
            "SELECT soniq_enqueue('mail.send', '{}', queue => 'due', "
            "run_at => now() - interval '1 second')"
        )
    assert _notes(listener, 0.3, expect=1) == [("soniq_new_job", "due")]


def test_a_duplicate_wakes_nobody(listener):
    with raw() as producer:
        call = "SELECT soniq_enqueue('mail.digest', '{}', queue => 'mail', dedup_key => 'd-1')"
        first = producer.execute(call).fetchone()[0]
        assert _notes(listener, 0.1, expect=1) == [("soniq_new_job", "mail")]
        assert producer.execute(call).fetchone()[0] == first
    assert _notes(listener, 0.4) == []

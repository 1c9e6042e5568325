"""Claim protocol v8: a claim never waits for a lock (issue 26, decision 0029).

Each test holds a lock the way an operator or a producer would, on a
psycopg connection of its own with its transaction left open, and calls the
SQL functions from other connections as any worker does. Those connections
set a lock_timeout of 2 s, so that version 7 (which waited without bound)
fails the test in seconds instead of hanging it. PostgreSQL only: SQLite has
no row locks (a claim there takes the database's one write lock, which
every writer holds briefly).
"""

import secrets
import threading
import time

import pytest

from tests.support.sql import raw

pytestmark = [
    # SQL functions on raw connections, no Django code in the path: the Django 5.2 passes
    # run them (version_independent).
    pytest.mark.version_independent,
    pytest.mark.postgresql_only,
    pytest.mark.django_db,  # sets the test database up; the raw connections below commit
    pytest.mark.usefixtures("flow_db"),
]

CLAIM_MANY = ("SELECT job_id, queue, generation, token "
              "FROM soniq_claim_many(%s, %s::text[], %s::text[], 30)")
#: What "at once" means here: a claim takes milliseconds; the bound of a wait is 2 s.
AT_ONCE = 1.0


def nonces(n):
    return [secrets.token_hex(16) for _ in range(n)]


def enqueue(conn, queue, count, priority=100):
    return [row[0] for row in conn.execute(
        "SELECT soniq_enqueue('bounded.job', jsonb_build_object('n', g), queue => %s, "
        "priority => %s) FROM generate_series(1, %s) AS g", [queue, priority, count])]


def claim(conn, n, queues=None, owner="w"):
    return conn.execute(CLAIM_MANY, [owner, nonces(n), queues]).fetchall()


def bounded(conn):
    """``conn`` with a lock_timeout: a claim that waits fails in 2 s instead of hanging."""
    conn.execute("SET lock_timeout = '2s'")
    return conn


def status(conn, job_id):
    return conn.execute("SELECT status FROM soniq_jobs WHERE id = %s", [job_id]).fetchone()[0]


# 1. A locked settings row holds its queue back; it never makes a claim wait. ------------


@pytest.mark.parametrize("limit", [{"concurrency": 5}, {"rate_limit": 5, "rate_period": 1}],
                         ids=["concurrency", "rate"])
def test_a_locked_settings_row_holds_its_queue_back_for_the_claim_which_returns_at_once(limit):
    with raw() as conn:
        limited = enqueue(conn, "api", 3, priority=1)  # first in claim order
        free = enqueue(conn, "free", 10)
        columns = ", ".join(limit)
        conn.execute(f"INSERT INTO soniq_queue_settings (queue, {columns}) "
                     f"VALUES ('api', {', '.join(['%s'] * len(limit))})", list(limit.values()))
    with raw(autocommit=False) as operator, raw() as worker:
        bounded(worker)
        # docs/operations.md's pause from SQL, run inside BEGIN ... and not committed yet.
        operator.execute("SELECT 1 FROM soniq_queue_settings WHERE queue = 'api' FOR UPDATE")
        started = time.monotonic()
        rows = claim(worker, 4)
        assert time.monotonic() - started < AT_ONCE
        assert [row[1] for row in rows] == ["free"] * 4
        # A claim of the limited queue alone: nothing, at once (held back, not waiting).
        started = time.monotonic()
        assert claim(worker, 2, ["api"]) == []
        assert time.monotonic() - started < AT_ONCE
        operator.rollback()
        # The row is free again: the queue is served.
        assert sorted(row[0] for row in claim(worker, 10)) == sorted(limited + free[4:])


def test_claimers_of_the_free_queue_never_wait_behind_a_claim_of_every_queue():
    """Version 7 locked the free queue's jobs, then waited for the limited queue's row.

    A claimer serving only the free queue then found them all taken (0 of 10)
    for as long as the row stayed locked. Version 8 learns the budgets first
    and never waits for them, so between the two claimers every due job of
    the free queue is claimed at once.
    """
    with raw() as conn:
        enqueue(conn, "api", 3, priority=1)
        free = enqueue(conn, "free", 10)
        conn.execute("INSERT INTO soniq_queue_settings (queue, concurrency) VALUES ('api', 5)")
    everything, errors = [], []

    def claim_every_queue():
        try:
            with raw() as conn:
                everything.extend(claim(bounded(conn), 5))
        except BaseException as error:  # reported below
            errors.append(error)

    with raw(autocommit=False) as operator, raw() as free_only:
        operator.execute("SELECT 1 FROM soniq_queue_settings WHERE queue = 'api' FOR UPDATE")
        first = threading.Thread(target=claim_every_queue)
        first.start()
        first.join(AT_ONCE)
        assert not first.is_alive(), "the claim of every queue waited for the settings row"
        mine = claim(bounded(free_only), 10, ["free"])
        operator.rollback()
    first.join(5)
    assert not errors, errors[0]
    assert sorted(row[0] for row in everything + mine) == sorted(free)
    assert len(mine) == 10 - len(everything)


def test_a_live_hold_counts_against_the_limit_and_a_lapsed_one_is_deleted():
    with raw() as conn:
        enqueue(conn, "api", 5)
        conn.execute("INSERT INTO soniq_queue_settings (queue, concurrency) VALUES ('api', 3)")
        conn.execute(
            "INSERT INTO soniq_queue_holds (job_id, generation, queue, claim_owner, "
            "lease_expires_at, created_at) "
            "SELECT gen_random_uuid(), 1, h.queue, h.owner, clock_timestamp() + h.lease, now() "
            "FROM (VALUES ('api', 'w-old', interval '1 minute'), "
            "             ('api', 'w-dead', interval '-1 second'), "
            "             ('other', 'w-old', interval '1 minute')) AS h(queue, owner, lease)")
        # 3 slots, 1 live hold of the queue: 2 jobs start. The lapsed hold counts
        # for nothing and is gone; another queue's hold is not this queue's.
        assert len(claim(conn, 5)) == 2
        assert conn.execute("SELECT claim_owner FROM soniq_queue_holds ORDER BY queue").fetchall(
            ) == [("w-old",), ("w-old",)]
        assert claim(conn, 5) == []


# 2. The reaper inside the claim never waits for a producer's uncommitted twin. ------------


@pytest.mark.parametrize("key", ["unique_job => true", "dedup_key => 'twin-key'"],
                         ids=["unique", "dedup"])
def test_the_reaper_leaves_a_lapsed_job_whose_twin_a_producer_has_not_committed(key):
    enqueue_twin = f"SELECT soniq_enqueue('bounded.twin', '{{\"n\": 1}}', {key})"
    with raw() as conn:
        lapsed = conn.execute(enqueue_twin).fetchone()[0]
        assert [row[0] for row in claim(conn, 1)] == [lapsed]
        conn.execute("SELECT set_config('soniq.fenced_write', 'on', false)")
        conn.execute("UPDATE soniq_jobs SET lease_expires_at = clock_timestamp() "
                     "- interval '1 second' WHERE id = %s", [lapsed])
        conn.execute("SELECT set_config('soniq.fenced_write', 'off', false)")
        [other] = enqueue(conn, "default", 1)
    with raw(autocommit=False) as producer, raw() as worker:
        # The producer's twin holds the key in the unique index until it ends.
        twin = producer.execute(enqueue_twin).fetchone()[0]
        assert twin != lapsed
        notices = []
        worker.add_notice_handler(lambda diag: notices.append(diag.message_primary))
        started = time.monotonic()
        assert [row[0] for row in claim(bounded(worker), 5)] == [other]
        assert time.monotonic() - started < AT_ONCE
        assert notices == []  # left for later, quietly
        # Left as it was: lapsed, still processing; a later claim settles it.
        assert status(worker, lapsed) == "processing"
        producer.commit()
        # The twin is committed: the lapsed job is superseded, the twin claimed.
        assert [row[0] for row in claim(worker, 5)] == [twin]
        assert status(worker, lapsed) == "cancelled"


def test_the_reaper_puts_the_job_back_when_the_producer_rolls_back():
    enqueue_twin = "SELECT soniq_enqueue('bounded.twin', '{\"n\": 2}', unique_job => true)"
    with raw() as conn:
        lapsed = conn.execute(enqueue_twin).fetchone()[0]
        claim(conn, 1)
        conn.execute("SELECT set_config('soniq.fenced_write', 'on', false)")
        conn.execute("UPDATE soniq_jobs SET lease_expires_at = clock_timestamp() "
                     "- interval '1 second' WHERE id = %s", [lapsed])
    with raw(autocommit=False) as producer, raw() as worker:
        producer.execute(enqueue_twin)
        started = time.monotonic()
        assert claim(bounded(worker), 5) == []
        assert time.monotonic() - started < AT_ONCE
        producer.rollback()
        [(job_id, _, generation, _)] = claim(worker, 5)
        assert (job_id, generation) == (lapsed, 2)


# 3. A completion closes the write gate before it returns (defect 8). ----------------------


def owned_submission(conn):
    """A queued owned submission: only the fenced functions may change or delete it."""
    [job_id] = enqueue(conn, "owned", 1)
    conn.execute("UPDATE soniq_jobs SET fence_required = true WHERE id = %s", [job_id])
    return job_id


COMPLETIONS = {
    "soniq_complete": "SELECT soniq_complete(%s, 'w', %s, %s, %s)",
    "soniq_complete_many, two": (
        "SELECT soniq_complete_many(ARRAY[%s, %s], 'w', ARRAY[%s, %s]::bigint[], "
        "ARRAY[%s, %s], ARRAY[%s, %s], ARRAY[NULL, NULL]::jsonb[])"),
    "a refused completion": "SELECT soniq_complete(%s, 'w', %s, 'not-the-token', %s)",
}


@pytest.mark.parametrize("call", list(COMPLETIONS))
def test_an_id_only_delete_after_a_completion_in_the_same_transaction_is_refused(call):
    with raw() as conn:
        owned = owned_submission(conn)
        enqueue(conn, "default", 2)
    with raw(autocommit=False) as conn:
        claimed = claim(conn, 2, ["default"])
        (a, _, gen_a, token_a), (b, _, gen_b, token_b) = claimed
        params = {
            "soniq_complete": [str(a), gen_a, token_a, "default"],
            "soniq_complete_many, two": [str(a), str(b), gen_a, gen_b, token_a, token_b,
                                         "default", "default"],
            "a refused completion": [str(a), gen_a, "default"],
        }[call]
        conn.execute(COMPLETIONS[call], params)
        assert conn.execute("SELECT current_setting('soniq.fenced_write', true)").fetchone()[0] \
            == "off"
        deleted = conn.execute("DELETE FROM soniq_jobs WHERE id = %s", [owned]).rowcount
        conn.commit()
        assert deleted == 0
    with raw() as conn:
        assert status(conn, owned) == "queued"

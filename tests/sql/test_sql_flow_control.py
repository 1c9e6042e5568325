"""Flow control as a worker in another language sees it: soniq_claim_many and soniq_claim.

Each claimer is a psycopg connection of its own, in autocommit, calling the
SQL functions the way docs/claim-protocol.md tells any worker to. Races are
real: threads released together on separate connections.
"""

import secrets
import threading
import time
import uuid

import psycopg
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

CLAIM_MANY = ("SELECT job_id, queue, generation, lease_expires_at, token "
              "FROM soniq_claim_many(%s, %s::text[], %s::text[], 30)")
COMPLETE = "SELECT soniq_complete(%s, %s, %s, %s, %s)"


def nonces(n):
    return [secrets.token_hex(16) for _ in range(n)]


def enqueue(conn, queue, count, priority=100):
    conn.execute("SELECT soniq_enqueue('flow.job', jsonb_build_object('n', g), queue => %s, "
                 "priority => %s) FROM generate_series(1, %s) AS g", [queue, priority, count])


def settings(conn, queue, **values):
    columns = ", ".join(values)
    marks = ", ".join(["%s"] * len(values))
    conn.execute(f"INSERT INTO soniq_queue_settings (queue, {columns}) VALUES (%s, {marks})",
                 [queue, *values.values()])


def claim(conn, n, queues=None, owner="go-worker"):
    return conn.execute(CLAIM_MANY, [owner, nonces(n), queues]).fetchall()


def count(conn, sql, params=()):
    return conn.execute(sql, params).fetchone()[0]


def test_a_paused_queue_yields_no_rows_to_either_claim_function():
    with raw() as conn:
        enqueue(conn, "emails", 2)
        enqueue(conn, "reports", 1)
        settings(conn, "emails", paused=True)
        assert [row[1] for row in claim(conn, 5)] == ["reports"]
        assert claim(conn, 5, ["emails"]) == []
        assert conn.execute("SELECT * FROM soniq_claim('go-worker', %s, ARRAY['emails'])",
                            [nonces(1)[0]]).fetchall() == []
        # What an operator in any language does: one UPDATE.
        conn.execute("UPDATE soniq_queue_settings SET paused = false WHERE queue = 'emails'")
        assert conn.execute("SELECT queue FROM soniq_claim('go-worker', %s)",
                            [nonces(1)[0]]).fetchall() == [("emails",)]


def test_soniq_claim_obeys_the_concurrency_limit_too():
    with raw() as conn:
        enqueue(conn, "api", 3)
        settings(conn, "api", configured_concurrency=1)
        claimed = [conn.execute("SELECT job_id FROM soniq_claim('w', %s)",
                                [nonces(1)[0]]).fetchall() for _ in range(3)]
        assert [len(rows) for rows in claimed] == [1, 0, 0]


def test_racing_claimers_never_exceed_the_concurrency_limit():
    """8 connections claim and complete as fast as they can; a sampler counts what runs."""
    limit, jobs, claimers = 3, 240, 8
    with raw() as conn:
        enqueue(conn, "api", jobs)
        enqueue(conn, "free", 40)
        settings(conn, "api", concurrency=limit)
    stop = threading.Event()
    seen, errors = [], []
    gate = threading.Barrier(claimers + 1)

    def claimer(index):
        owner = str(uuid.uuid4())
        try:
            with raw() as conn:
                gate.wait()
                while not stop.is_set():
                    rows = conn.execute(CLAIM_MANY, [owner, nonces(4), None]).fetchall()
                    if not rows and count(conn, "SELECT count(*) FROM soniq_jobs "
                                                "WHERE status = 'queued'") == 0:
                        return
                    for job_id, queue, generation, _, token in rows:
                        time.sleep(0.002)
                        assert conn.execute(COMPLETE, [str(job_id), owner, generation, token,
                                                       queue]).fetchone()[0] is True
        except BaseException as error:  # reported below
            errors.append(error)

    def sampler():
        with raw() as conn:
            while not stop.is_set():
                seen.append(count(conn, "SELECT count(*) FROM soniq_jobs "
                                        "WHERE status = 'processing' AND queue = 'api'"))

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(claimers)]
    watch = threading.Thread(target=sampler)
    for thread in threads:
        thread.start()
    watch.start()
    gate.wait()
    for thread in threads:
        thread.join(120)
    stop.set()
    watch.join(10)
    assert not errors, errors[0]
    with raw() as conn:
        assert count(conn, "SELECT count(*) FROM soniq_jobs WHERE status = 'done'") == jobs + 40
    assert len(seen) > 50 and max(seen) <= limit
    assert max(seen) == limit  # and the slots were used


def test_racing_claimers_never_start_more_than_the_rate_in_any_window():
    rate, period = 20, 1
    with raw() as conn:
        enqueue(conn, "sms", 60)
        settings(conn, "sms", rate_limit=rate, rate_period=period)
    starts, errors = [], []
    deadline = time.monotonic() + 2.5
    gate = threading.Barrier(6)

    def claimer(index):
        try:
            with raw() as conn:
                gate.wait()
                while time.monotonic() < deadline:
                    rows = conn.execute(CLAIM_MANY, [f"w{index}", nonces(3), ["sms"]]).fetchall()
                    # The claim's time: the lease (30 s) counts from it.
                    starts.extend(row[3].timestamp() - 30 for row in rows)
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors[0]
    starts.sort()
    # At most `rate` starts in any window of `period` seconds (half-open: (t - P, t]) ...
    most = max(sum(1 for s in starts if t - period < s <= t) for t in starts)
    assert most <= rate
    # ... and the rate was used: 2.5 s hold windows starting at 0, 1 and 2 s.
    assert len(starts) == 60 or len(starts) >= 2 * rate + 1
    with raw() as conn:
        assert count(conn, "SELECT count(*) FROM soniq_queue_starts WHERE queue = 'sms'") <= rate


def test_a_claim_of_unlimited_queues_takes_no_lock_a_limited_claim_skips_a_locked_row():
    with raw() as conn:
        enqueue(conn, "free", 2)
        enqueue(conn, "api", 2)
        settings(conn, "api", concurrency=5)
    with raw(autocommit=False) as holder, raw() as other:
        # Another claimer holds the queue's row lock, as during its claim.
        holder.execute("SELECT 1 FROM soniq_queue_settings WHERE queue = 'api' FOR UPDATE")
        other.execute("SET lock_timeout = '200ms'")
        assert [row[1] for row in claim(other, 5, ["free"])] == ["free", "free"]
        # Version 8: the limited queue is held back for this claim; nothing waits.
        assert claim(other, 1, ["api"]) == []
        holder.rollback()
        assert len(claim(other, 5, ["api"])) == 2


def test_an_empty_limited_queue_takes_no_lock():
    with raw() as conn:
        enqueue(conn, "free", 1)
        settings(conn, "api", concurrency=1)
    with raw(autocommit=False) as holder, raw() as other:
        holder.execute("SELECT 1 FROM soniq_queue_settings WHERE queue = 'api' FOR UPDATE")
        other.execute("SET lock_timeout = '200ms'")
        assert [row[1] for row in claim(other, 5)] == ["free"]
        holder.rollback()


@pytest.mark.parametrize("level", [psycopg.IsolationLevel.REPEATABLE_READ,
                                   psycopg.IsolationLevel.SERIALIZABLE])
def test_a_limited_claim_outside_read_committed_is_refused(level):
    with raw() as conn:
        enqueue(conn, "api", 1)
        enqueue(conn, "free", 1)
        settings(conn, "api", concurrency=1)
    with raw(autocommit=False) as conn:
        conn.isolation_level = level
        # Unlimited queues need no lock and no count: served as before.
        assert len(claim(conn, 1, ["free"])) == 1
        conn.commit()
        with pytest.raises(psycopg.Error) as caught:
            claim(conn, 1, ["api"])
        assert (caught.value.sqlstate, caught.value.diag.message_hint) == ("22023", "CONFIG")
        assert "READ COMMITTED" in caught.value.diag.message_primary
        conn.rollback()


@pytest.mark.parametrize("helper", ["soniq_queue_budget_v1(text, integer)",
                                    "soniq_queue_budget_v2(text, integer)",
                                    "soniq_reap_lapsed_v2(integer, double precision)"])
def test_the_claims_helpers_are_not_executable_by_public(helper):
    with raw() as conn:
        assert count(conn, "SELECT has_function_privilege('public', %s, 'EXECUTE')",
                     [helper]) is False

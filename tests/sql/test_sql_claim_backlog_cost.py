"""A claim does not read the backlogs it does not serve (claim protocol v8, decision 0029).

Version 7 found the next jobs of the queues a claim may serve by scanning an
index of every queue in claim order and filtering the queue, so the queued
jobs of a paused queue, of a limited queue whose budget is 0, or of a queue
the worker does not name were read again by every claim that came after
them: "Rows Removed by Filter: 100000", and a claim costs 15 ms instead of
0.4. Version 8 scans each queue it serves on its own. The plans PL/pgSQL runs
inside soniq_claim_many are read with auto_explain (ANALYZE, BUFFERS, JSON,
at NOTICE level) after a few calls, so that a generic plan, if PL/pgSQL
switches to one, is the one examined; 100,000 held-back jobs are loaded
once for the module. PostgreSQL only: tests/owned/test_claim_backlog_cost.py
counts the SQLite twin's work.
"""

import json
import secrets

import pytest

from tests.support.sql import raw, wait_for_older_transactions

pytestmark = [pytest.mark.version_independent,  # SQL only: run in the Django 5.2 passes
              pytest.mark.postgresql_only, pytest.mark.django_db]

HELD = 100_000


@pytest.fixture(scope="module")
def backlog(django_db_setup):
    """HELD queued jobs in the queue 'held', enqueued before anything else; removed after."""
    with raw() as conn:
        conn.execute(
            "INSERT INTO soniq_jobs (id, job_name, args, queue, status, created_at, updated_at) "
            "SELECT gen_random_uuid(), 'cost.held', '{}', 'held', 'queued', "
            "now() - interval '1 hour', now() FROM generate_series(1, %s)", [HELD])
        conn.execute("ANALYZE soniq_jobs")
    yield
    with raw() as conn:
        empty(conn)
        conn.execute("DELETE FROM soniq_jobs")
        # Their dead index entries would cost later tests' claims (their buffers are counted).
        conn.execute("VACUUM ANALYZE soniq_jobs")


def empty(conn):
    conn.execute("SELECT set_config('soniq.fenced_write', 'on', false)")
    conn.execute("DELETE FROM soniq_jobs WHERE queue <> 'held'")
    conn.execute("DELETE FROM soniq_queue_settings")
    conn.execute("DELETE FROM soniq_queue_holds")
    conn.execute("SELECT set_config('soniq.fenced_write', 'off', false)")


def nodes(plan):
    yield plan
    for child in plan.get("Plans", ()):
        yield from nodes(child)


def explained_claim(conn, queues, calls=8):
    """Claim ``calls`` times, each rolled back; the claimed ids and the last call's plans.

    The plans are those of the statements inside the function (the call's own
    plan, which counts them all again, is left out).
    """
    notices = []
    conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    claimed = []
    for i in range(calls):
        if i == calls - 1:
            for setting in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                            "SET auto_explain.log_analyze = on",
                            "SET auto_explain.log_buffers = on",
                            "SET auto_explain.log_format = json",
                            "SET auto_explain.log_nested_statements = on",
                            "SET auto_explain.log_level = notice"):
                conn.execute(setting)
            notices.clear()
        with conn.transaction(force_rollback=True):
            claimed.append([row[0] for row in conn.execute(
                "SELECT job_id FROM soniq_claim_many(%s, %s::text[], %s::text[])",
                ["cost-w", [secrets.token_hex(16)], queues], prepare=True)])
    conn.execute("SET auto_explain.log_min_duration = -1")
    plans = [json.loads(n[n.index("{"):]) for n in notices if "plan:" in n]
    inner = [p for p in plans if "soniq_claim_many(" not in p["Query Text"]]
    assert inner, notices
    return claimed, inner


def cost(plans):
    """Rows read and removed on soniq_jobs, and buffers touched, over the statements."""
    removed = buffers = 0
    for plan in plans:
        for node in nodes(plan["Plan"]):
            if node.get("Relation Name") == "soniq_jobs":
                removed += node.get("Rows Removed by Filter", 0)
        buffers += plan["Plan"].get("Shared Hit Blocks", 0) + plan["Plan"].get(
            "Shared Read Blocks", 0)
    return removed, buffers


SCENARIOS = {
    # The operator paused the big queue; the worker serves every queue.
    "paused": ("INSERT INTO soniq_queue_settings (queue, paused) VALUES ('held', true)", None),
    # The big queue's only slot is taken (by a hold): its budget is 0.
    "budget 0": ("INSERT INTO soniq_queue_settings (queue, concurrency) VALUES ('held', 1); "
                 "INSERT INTO soniq_queue_holds (job_id, generation, queue, claim_owner, "
                 "lease_expires_at, created_at) VALUES (gen_random_uuid(), 1, 'held', 'w', "
                 "clock_timestamp() + interval '1 hour', now())", None),
    # Paused, and a limited queue with nothing due: finding that out reads nothing either.
    "paused, limited empty": ("INSERT INTO soniq_queue_settings (queue, paused) "
                              "VALUES ('held', true); INSERT INTO soniq_queue_settings "
                              "(queue, concurrency) VALUES ('api', 2)", None),
    # No flow control; the worker names its queue, the big one is someone else's.
    "not named": ("SELECT 1", ["default", "other"]),
}


@pytest.mark.parametrize("scheduled", [False, True], ids=["nothing scheduled", "one due"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_a_claim_reads_none_of_a_backlog_it_does_not_serve(backlog, scenario, scheduled):
    setup, queues = SCENARIOS[scenario]
    with raw() as conn:
        # Rows earlier cases and earlier tests deleted (jobs, and the queue settings and
        # holds the budget reads), left as dead index entries while another session's
        # transaction held the horizon, would be counted as this claim's reads.
        wait_for_older_transactions(conn)
        conn.execute("VACUUM soniq_jobs, soniq_queue_settings, soniq_queue_holds")
        try:
            conn.execute(setup)
            ready = conn.execute("SELECT soniq_enqueue('cost.ready')").fetchone()[0]
            # More of them, after it: with statistics that see them, version 7 took an
            # index of every queue in claim order for the claim (and walked the backlog).
            conn.execute("SELECT soniq_enqueue('cost.ready', jsonb_build_object('n', g)) "
                         "FROM generate_series(1, 500) AS g")
            conn.execute("ANALYZE soniq_jobs")
            if scheduled:  # the claim then also looks at the due scheduled jobs
                conn.execute("SELECT soniq_enqueue('cost.due', priority => 200, "
                             "run_at => now() - interval '1 minute')")
            claimed, plans = explained_claim(conn, queues)
        finally:
            empty(conn)
    assert claimed == [[ready]] * len(claimed)
    removed, buffers = cost(plans)
    # Version 7: 100,000 rows removed and thousands of buffers; version 8: 0 and 35 to 60.
    assert removed == 0, plans
    assert buffers < 150, plans


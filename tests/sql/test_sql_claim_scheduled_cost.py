"""A claim does not read the jobs scheduled for later (claim protocol v6, decision 0018).

Version 5 scanned the queued jobs in claim order and filtered out those not
yet due, so each claim read every job scheduled for later that was enqueued
before the next due one. Version 6 reads none of them while no scheduled job
is due, and, when one is, reads past scheduled jobs only, never past the
unscheduled ones. The plan PL/pgSQL runs inside soniq_claim is read
with auto_explain (ANALYZE, at NOTICE level), after a few calls so that a
generic plan, if PL/pgSQL switches to one, is the one examined. PostgreSQL
only: SQLite's twin has no such plan.
"""

import re
import secrets

import pytest

from tests.support.sql import raw

pytestmark = [pytest.mark.version_independent,  # SQL only: run in the Django 5.2 passes
              pytest.mark.postgresql_only, pytest.mark.django_db,
              pytest.mark.usefixtures("committed_db")]

LATER = 3000


def enqueue_many(conn, name, count, run_at="NULL"):
    conn.execute(f"SELECT soniq_enqueue(%s, jsonb_build_object('n', g), run_at => {run_at}) "
                 "FROM generate_series(1, %s) AS g", [name, count])


def load(conn):
    """LATER jobs scheduled a day ahead, enqueued first; then one ready job."""
    enqueue_many(conn, "cost.later", LATER, "now() + interval '1 day'")
    ready = conn.execute("SELECT soniq_enqueue('cost.ready')").fetchone()[0]
    conn.execute("ANALYZE soniq_jobs")
    return ready


def rows_removed(plan):
    return sum(int(n) for n in re.findall(r"Rows Removed by Filter: (\d+)", plan))


def explained_claims(conn, queues, calls=8):
    """Claim ``calls`` times, each rolled back; the plans of the last call's statements."""
    notices = []
    conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    claimed = []
    for i in range(calls):
        if i == calls - 1:
            for setting in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                            "SET auto_explain.log_analyze = on",
                            "SET auto_explain.log_buffers = on",
                            "SET auto_explain.log_nested_statements = on",
                            "SET auto_explain.log_level = notice"):
                conn.execute(setting)
        with conn.transaction(force_rollback=True):
            claimed.append(conn.execute(
                "SELECT job_id FROM soniq_claim(%s, %s, %s::text[])",
                ["cost-w", secrets.token_hex(16), queues], prepare=True).fetchone()[0])
    picks = [n for n in notices if "FOR UPDATE SKIP LOCKED" in n and "soniq_jobs" in n]
    assert picks, notices
    return claimed, "\n".join(picks)


@pytest.mark.parametrize("queues", [None, ["default"]], ids=["all queues", "named queue"])
def test_a_claim_reads_none_of_the_jobs_scheduled_for_later(queues):
    with raw() as conn:
        ready = load(conn)
        claimed, plan = explained_claims(conn, queues)
    assert set(claimed) == {ready}
    assert rows_removed(plan) == 0, plan
    assert sum(int(n) for n in re.findall(r"shared hit=(\d+)", plan)) < 50, plan


def test_under_flow_control_the_free_queues_read_none_of_them():
    with raw() as conn:
        ready = load(conn)
        conn.execute("INSERT INTO soniq_queue_settings (queue, concurrency) VALUES ('held', 5)")
        try:
            claimed, plan = explained_claims(conn, None)
        finally:
            conn.execute("DELETE FROM soniq_queue_settings")
    assert set(claimed) == {ready}
    assert rows_removed(plan) == 0, plan


def test_with_a_scheduled_job_due_the_claim_reads_past_no_unscheduled_job():
    with raw() as conn:
        due = conn.execute("SELECT soniq_enqueue('cost.due', run_at => now() - interval '1 "
                           "minute', priority => 200)").fetchone()[0]
        enqueue_many(conn, "cost.ready", LATER)
        conn.execute("ANALYZE soniq_jobs")
        claimed, plan = explained_claims(conn, None)
        # The due job comes last in claim order (priority 200): a ready job is claimed...
        assert due not in claimed
        # ... and finding the due candidate read none of the 3,000 ready jobs.
        assert rows_removed(plan) == 0, plan
        assert "soniq_jobs_claim_scheduled_idx" in plan, plan

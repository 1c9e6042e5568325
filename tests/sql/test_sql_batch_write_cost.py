"""Claim protocol v7 writes a batch by one UPDATE; the answers are the per-row path's (decision 0026).

For a batch of more than one job, version 7's soniq_complete_many and
soniq_claim_many lock the rows as before and write them with one UPDATE
matched by ctid, where version 2's soniq_complete_many and version 6's
soniq_claim_many wrote one row per UPDATE. The per-row bodies, read from the
released files themselves, are installed here as pg_temp functions; each
hypothesis example builds one mixed set of jobs in a transaction, runs the
same batch through both (a savepoint rolled back between them) and requires
the same per-element answers and the same rows afterwards. PostgreSQL only:
SQLite's twin in owned/_store.py is per-row.
"""

import re
import uuid

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from soniq_django.sql import released_function

from tests.support.sql import quote_ident, raw

pytestmark = [pytest.mark.postgresql_only, pytest.mark.django_db,
              pytest.mark.usefixtures("committed_db")]

OWNER = "batch-owner"

#: What a job is when the batch comes: claimed by OWNER with a live lease, or not.
STATES = ("live", "lapsed", "cancel_requested", "done", "other_owner", "queued")
#: How a batch element names its job's fence.
VARIANTS = ("exact", "stale_generation", "newer_generation", "wrong_token", "wrong_queue",
            "upper_case_id", "unknown_id")


def install_reference(conn, released: str, function: str, as_name: str) -> None:
    text = released_function(released, function)
    text = text.replace("{schema}." + function + "(", "pg_temp." + as_name + "(", 1)
    # The body's own references to its arguments (soniq_claim_many.pid, ...).
    text = re.sub(r"\b" + function + r"\.", as_name + ".", text)
    (current,) = conn.execute("SELECT current_schema()").fetchone()
    conn.execute(text.replace("{schema}", quote_ident(current)))


@pytest.fixture
def conn():
    with raw(autocommit=False) as connection:
        install_reference(connection, "claim_protocol_v2.sql", "soniq_complete_many",
                          "per_row_complete_many")
        install_reference(connection, "claim_protocol_v6.sql", "soniq_claim_many",
                          "per_row_claim_many")
        connection.commit()
        yield connection
        connection.rollback()


def make_jobs(conn, states, queue):
    """One job per state, in queue ``queue``; their fences as OWNER holds them.

    Claimed first, one at a time, then the queued ones enqueued, then the
    leases lapsed (a claim would settle a lapsed lease first)."""
    fences = {}
    for n, state in enumerate(states):
        if state == "queued":
            continue
        job_id = str(conn.execute("SELECT soniq_enqueue('batch.job', queue => %s)",
                                  [queue]).fetchone()[0])
        owner = "someone-else" if state == "other_owner" else OWNER
        token = f"nonce-{queue}-{n}"
        claimed, generation = conn.execute(
            "SELECT job_id::text, generation FROM soniq_claim_many(%s, ARRAY[%s], ARRAY[%s])",
            [owner, token, queue]).fetchone()
        assert claimed == job_id
        fences[n] = (job_id, generation, token, queue)
    for n, state in enumerate(states):
        if state == "queued":
            job_id = str(conn.execute("SELECT soniq_enqueue('batch.job', queue => %s)",
                                      [queue]).fetchone()[0])
            fences[n] = (job_id, 1, f"never-{n}", queue)
    conn.execute("SELECT set_config('soniq.fenced_write', 'on', true)")
    for n, state in enumerate(states):
        job_id, generation, token, _ = fences[n]
        if state == "lapsed":
            conn.execute("UPDATE soniq_jobs SET lease_expires_at = clock_timestamp() "
                         "- interval '1 second' WHERE id = %s", [job_id])
        elif state == "cancel_requested":
            conn.execute("UPDATE soniq_jobs SET cancel_requested = true WHERE id = %s", [job_id])
        elif state == "done":
            assert conn.execute("SELECT soniq_complete(%s, %s, %s, %s, %s)",
                                [job_id, OWNER, generation, token, queue]).fetchone()[0]
    conn.execute("SELECT set_config('soniq.fenced_write', 'off', true)")
    return [fences[n] for n in range(len(states))]


def element(fence, variant):
    job_id, generation, token, queue = fence
    if variant == "stale_generation":
        generation = max(1, generation - 1) if generation > 1 else generation + 2
    elif variant == "newer_generation":
        generation += 1
    elif variant == "wrong_token":
        token += "-x"
    elif variant == "wrong_queue":
        queue += "-x"
    elif variant == "upper_case_id":
        job_id = job_id.upper()
    elif variant == "unknown_id":
        job_id = str(uuid.uuid4())
    return job_id, generation, token, queue


def rows(conn, queue):
    return conn.execute(
        "SELECT id::text, status, result, claim_generation, claim_token, claim_owner, attempts,"
        " lease_expires_at IS NULL, expires_at IS NULL, pid, cancel_requested"
        " FROM soniq_jobs WHERE queue = %s ORDER BY id", [queue]).fetchall()


def run_both(conn, call, params, queue):
    """``call`` run by version 7 and by the per-row reference from the same state."""
    conn.execute("SAVEPOINT before_batch")
    fast = conn.execute(call.format(fn="soniq_"), params).fetchall(), rows(conn, queue)
    conn.execute("ROLLBACK TO SAVEPOINT before_batch")
    slow = conn.execute(call.format(fn="pg_temp.per_row_"), params).fetchall(), rows(conn, queue)
    conn.execute("ROLLBACK TO SAVEPOINT before_batch")
    return fast, slow


batches = st.lists(st.sampled_from(STATES), min_size=1, max_size=5).flatmap(
    lambda states: st.tuples(
        st.just(states),
        st.lists(st.tuples(st.integers(0, len(states) - 1), st.sampled_from(VARIANTS)),
                 min_size=2, max_size=12)))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches)
def test_a_batch_of_completions_gets_the_per_row_answers(conn, batch):
    states, picks = batch
    queue = f"q{uuid.uuid4().hex[:8]}"
    fences = make_jobs(conn, states, queue)
    sent = [element(fences[index], variant) for index, variant in picks]
    params = [[e[0] for e in sent], OWNER, [e[1] for e in sent], [e[2] for e in sent],
              [e[3] for e in sent], [f'{{"element": {i}}}' for i in range(len(sent))]]
    call = ("SELECT {fn}complete_many(%s::text[], %s, %s::bigint[], %s::text[], %s::text[], "
            "%s::jsonb[])")
    fast, slow = run_both(conn, call, params, queue)
    assert fast == slow
    conn.rollback()


def test_duplicates_complete_once_the_first_whose_fence_holds(conn):
    queue = "dup"
    ((job_id, generation, token, _),) = make_jobs(conn, ["live"], queue)
    params = [[job_id] * 3, OWNER, [generation] * 3, [token + "-x", token, token],
              [queue] * 3, ['"first"', '"second"', '"third"']]
    call = ("SELECT {fn}complete_many(%s::text[], %s, %s::bigint[], %s::text[], %s::text[], "
            "%s::jsonb[])")
    fast, slow = run_both(conn, call, params, queue)
    assert fast == slow
    assert fast[0] == [([False, True, False],)]
    assert fast[1][0][1:3] == ("done", "second")
    conn.rollback()


claims = st.tuples(
    st.lists(st.tuples(st.integers(0, 3), st.sampled_from(("now", "due", "later")),
                       st.sampled_from(("a", "b"))), min_size=0, max_size=8),
    st.integers(2, 6),
    st.sampled_from((None, ("a",), ("a", "b"))),
    st.sampled_from(("none", "pause_b", "limit_a")),
)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(claims)
def test_a_batch_of_claims_gets_the_per_row_answers(conn, claim):
    jobs, wanted, queues, flow = claim
    prefix = f"c{uuid.uuid4().hex[:6]}"
    for priority, when, queue in jobs:
        run_at = {"now": "NULL", "due": "now() - interval '1 minute'",
                  "later": "now() + interval '1 hour'"}[when]
        conn.execute(f"SELECT soniq_enqueue('batch.claim', queue => %s, priority => %s, "
                     f"run_at => {run_at})", [f"{prefix}{queue}", priority])
    if flow == "pause_b":
        conn.execute("INSERT INTO soniq_queue_settings (queue, paused) VALUES (%s, true)",
                     [f"{prefix}b"])
    elif flow == "limit_a":
        conn.execute("INSERT INTO soniq_queue_settings (queue, concurrency) VALUES (%s, 2)",
                     [f"{prefix}a"])
    served = [f"{prefix}{q}" for q in queues or ("a", "b")]
    tokens = [f"{prefix}-t{i}" for i in range(wanted)]
    call = ("SELECT job_id::text, job_name, queue, priority, attempts, generation, owner, token,"
            " lease_expires_at IS NOT NULL FROM {fn}claim_many(%s, %s::text[], %s::text[])")
    conn.execute("SAVEPOINT before_batch")
    fast = conn.execute(call.format(fn="soniq_"), [OWNER, tokens, served]).fetchall()
    fast_rows = rows_of(conn, prefix)
    conn.execute("ROLLBACK TO SAVEPOINT before_batch")
    slow = conn.execute(call.format(fn="pg_temp.per_row_"), [OWNER, tokens, served]).fetchall()
    assert (fast, fast_rows) == (slow, rows_of(conn, prefix))
    conn.rollback()


def rows_of(conn, prefix):
    return conn.execute(
        "SELECT id::text, status, claim_generation, claim_token, claim_owner, attempts, pid,"
        " cancel_requested, lease_expires_at IS NULL FROM soniq_jobs WHERE queue LIKE %s"
        " ORDER BY id", [prefix + "%"]).fetchall()


def plans(conn, sql, params):
    """The plans (auto_explain, at NOTICE) of the statements ``sql`` runs inside its functions."""
    notices = []
    conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    for setting in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                    "SET auto_explain.log_nested_statements = on",
                    "SET auto_explain.log_level = notice"):
        conn.execute(setting)
    result = conn.execute(sql, params).fetchall()
    conn.execute("SET auto_explain.log_min_duration = -1")
    return result, [n for n in notices if "Update on soniq_jobs" in n]


def test_a_batch_is_one_update_by_ctid_and_a_batch_of_one_stays_per_row(conn):
    # A table of some size (a scan of a handful of rows costs less than any lookup).
    queue = "plans"
    conn.execute("SELECT soniq_enqueue('batch.plan', queue => %s) FROM generate_series(1, 6)",
                 [queue])
    conn.execute("INSERT INTO soniq_jobs (id, job_name, args, queue, status, expires_at) "
                 "SELECT gen_random_uuid(), 'batch.old', '{}', 'old', 'done', "
                 "now() + interval '1 hour' FROM generate_series(1, 5000)")
    # Many processing rows without a lease (the claim's reaper leaves them alone): an
    # index on the lease (soniq_jobs_lease_idx) then looks selective for "lease > now".
    conn.execute("INSERT INTO soniq_jobs (id, job_name, args, queue, status, claim_owner, "
                 "claim_token, claim_generation) "
                 "SELECT gen_random_uuid(), 'batch.leaseless', '{}', 'leaseless', 'processing', "
                 "'x', 'leaseless-' || g, 1 FROM generate_series(1, 5000) g")
    conn.execute("ANALYZE soniq_jobs")
    claim = ("SELECT job_id::text, generation, token, queue "
             "FROM soniq_claim_many(%s, %s::text[], ARRAY[%s])")
    claimed, updates = plans(conn, claim, [OWNER, ["p1", "p2", "p3"], queue])
    assert len(claimed) == 3
    assert len(updates) == 1 and "Tid Scan on soniq_jobs" in updates[0]
    complete = ("SELECT soniq_complete_many(%s::text[], %s, %s::bigint[], %s::text[], "
                "%s::text[], %s::jsonb[])")
    columns = [list(column) for column in zip(*claimed)]
    done, updates = plans(conn, complete, [columns[0], OWNER, *columns[1:], [None] * 3])
    assert done == [([True, True, True],)]
    # One UPDATE, by ctid; the fence predicate (IS TRUE) is a filter, not an index condition.
    assert len(updates) == 1 and "Tid Scan on soniq_jobs" in updates[0], updates
    assert "Index" not in updates[0].split("Tid Scan on soniq_jobs")[1], updates
    one, updates = plans(conn, claim, [OWNER, ["p4"], queue])
    assert len(one) == 1 and len(updates) == 1 and "soniq_jobs_pkey" in updates[0]
    conn.rollback()

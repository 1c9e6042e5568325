"""Claim protocol v9: a claim's cost does not grow under a pinned horizon (issue 27).

A session holds a REPEATABLE READ snapshot (as a report or pg_dump would)
while jobs are enqueued, claimed and completed on other connections: the
index entries of every claimed job and of every finished job's lease stay,
and no scan can mark them dead. What a claim reads is counted exactly, with
PostgreSQL's own per-transaction counters of the entries each index handed
out (``pg_stat_get_xact_tuples_returned``), read in the claim's transaction.
Version 8 read every entry since the pin on every claim; version 9 reads
them once, then starts where the last claim stopped (decision 0035).
PostgreSQL only: SQLite keeps no old row versions for a reader.
"""

import secrets
import time

import pytest

from tests.support.sql import raw, wait_for_older_transactions

pytestmark = [
    # SQL functions on raw connections, no Django code in the path: the Django 5.2 passes
    # run them (version_independent).
    pytest.mark.version_independent,
    pytest.mark.postgresql_only,
    pytest.mark.django_db(transaction=True),  # the raw connections below commit
]

#: Jobs run through the queue while the snapshot is held: well past DEAD_ENTRIES (1,000).
PINNED_JOBS = 3000
#: What a claim from where the last one stopped may read: its own jobs, and a few more.
FEW = 50
#: The leases of the jobs run through while the snapshot is held (seconds).
LEASE = 1.0


def nonces(n):
    return [secrets.token_hex(16) for _ in range(n)]


def enqueue(conn, count, *, name="pinned.job", priority=100, queue="default"):
    return [row[0] for row in conn.execute(
        "SELECT soniq_enqueue(%s, jsonb_build_object('n', g), priority => %s, queue => %s) "
        "FROM generate_series(1, %s) AS g", [name, priority, queue, count])]


def run_through(count, batch=200):
    """Enqueue ``count`` jobs, then claim and complete them all, a batch at a time, on a
    connection of their own (other workers: the session a test measures starts afresh).

    Jobs enqueued by one statement share their created_at, and a claim cannot start
    inside such a tie: here each job has its own, as under a steady load (decision 0035).
    Their leases are of LEASE seconds, and over when this returns (by more than the probe's
    LAPSED_MARGIN of 1 s): the probe for lapsed leases then meets every one of them in
    soniq_jobs_lease_idx.
    """
    with raw() as conn, conn.cursor() as cursor:
        # One statement each: distinct created_at, as a steady load.
        cursor.executemany("SELECT soniq_enqueue('pinned.job', jsonb_build_object('n', %s::int))",
                           [(n,) for n in range(count)])
        done = 0
        while done < count:
            claimed = conn.execute(
                "SELECT job_id::text, generation, token, queue "
                "FROM soniq_claim_many('w', %s::text[], NULL, %s)", [nonces(batch), LEASE]).fetchall()
            assert claimed
            conn.execute("SELECT soniq_complete_many(%s::text[], 'w', %s::bigint[], %s::text[], "
                         "%s::text[], array_fill(NULL::jsonb, ARRAY[%s]))",
                         [*[list(column) for column in zip(*claimed)], len(claimed)])
            done += len(claimed)
    time.sleep(LEASE + 1.2)


READ = ("SELECT c.relname, pg_stat_get_xact_tuples_returned(c.oid) FROM pg_class AS c "
        "WHERE c.relname IN ('soniq_jobs_claim_now_idx', 'soniq_jobs_lease_idx', "
        "'soniq_jobs_claim_queue_now_idx') AND c.relnamespace = current_schema()::regnamespace")


def claim_reading(conn, n=1, queues=None):
    """Claim ``n`` jobs in a transaction of their own: (job names, entries read per index).

    The counters are read before and after the claim, in its transaction: they also hold
    what earlier transactions read until the session reports its statistics.
    """
    with conn.transaction():
        before = dict(conn.execute(READ).fetchall())
        names = [row[0] for row in conn.execute(
            "SELECT job_name FROM soniq_claim_many('w', %s::text[], %s::text[])",
            [nonces(n), queues]).fetchall()]
        after = dict(conn.execute(READ).fetchall())
    return names, {index: after[index] - before[index] for index in after}


@pytest.fixture
def pinned():
    """A session holding one snapshot (REPEATABLE READ, read once), released at the end."""
    with raw() as holder:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM soniq_jobs").fetchone()
        try:
            yield holder
        finally:
            holder.execute("ROLLBACK")


def test_claims_under_a_pinned_horizon_read_the_dead_entries_once(pinned):
    with raw() as worker:
        run_through(PINNED_JOBS)
        enqueue(worker, 20, name="pinned.after")
        # The first two claims read every entry since the pin (the first marks dead what
        # it can; the second finds that a snapshot still needs them) ...
        for _ in range(2):
            names, first = claim_reading(worker)
            assert names == ["pinned.after"]
            assert first["soniq_jobs_claim_now_idx"] >= PINNED_JOBS
            assert first["soniq_jobs_lease_idx"] >= PINNED_JOBS
        # ... the next ones start where it stopped: the scan in claim order and the probe
        # for lapsed leases alike (version 8 read them all again, every claim).
        for _ in range(3):
            names, read = claim_reading(worker)
            assert names == ["pinned.after"]
            assert read["soniq_jobs_claim_now_idx"] < FEW, read
            assert read["soniq_jobs_lease_idx"] < FEW, read


def test_a_claim_of_one_queue_reads_the_dead_entries_once(pinned):
    with raw() as worker:
        run_through(PINNED_JOBS)
        enqueue(worker, 20, name="pinned.after")
        for _ in range(2):
            names, first = claim_reading(worker, queues=["default"])
            assert names == ["pinned.after"]
            assert first["soniq_jobs_claim_queue_now_idx"] >= PINNED_JOBS
        for _ in range(3):
            names, read = claim_reading(worker, queues=["default"])
            assert names == ["pinned.after"]
            assert read["soniq_jobs_claim_queue_now_idx"] < FEW, read


def test_claims_from_where_the_last_stopped_keep_claim_order(pinned):
    with raw() as worker:
        run_through(PINNED_JOBS)
        # One statement: twenty jobs with the same created_at (a tie, in table order).
        tied = enqueue(worker, 20, name="pinned.tied")
        for _ in range(2):  # from the start, twice: then from where the last stopped
            names, _ = claim_reading(worker)
            assert names == ["pinned.tied"]
        # Every job of the tie is claimed, none skipped, each once.
        claimed = []
        for _ in range(4):
            with worker.transaction():
                claimed += [row[0] for row in worker.execute(
                    "SELECT job_id FROM soniq_claim_many('w', %s::text[])", [nonces(5)])]
        assert len(claimed) == len(set(claimed)) == 18
        assert set(claimed) < set(tied)
        # A better priority enqueued later comes first; a worse one after the rest.
        enqueue(worker, 3, name="pinned.later")
        enqueue(worker, 1, name="pinned.urgent", priority=1)
        enqueue(worker, 1, name="pinned.lazy", priority=500)
        names, read = claim_reading(worker, n=5)
        assert names == ["pinned.urgent", "pinned.later", "pinned.later", "pinned.later",
                         "pinned.lazy"]
        assert read["soniq_jobs_claim_now_idx"] < FEW, read


def test_a_job_behind_where_claims_start_is_claimed_by_the_next_scan_from_the_start(pinned):
    with raw() as worker:
        run_through(PINNED_JOBS)
        enqueue(worker, 3, name="pinned.after")
        for _ in range(2):
            claim_reading(worker)  # reads from the start, twice, then hints
        # A job committed late, created before where the claims now start.
        [late] = enqueue(worker, 1, name="pinned.late")
        worker.execute("UPDATE soniq_jobs SET created_at = created_at - interval '1 hour' "
                       "WHERE id = %s", [late])
        names, _ = claim_reading(worker)
        assert names == ["pinned.after"]  # from where the last claim stopped
        # FULL_SCAN_EVERY later (brought forward here), a scan from the start finds it.
        hint = worker.execute("SELECT current_setting('soniq.claim_hint')").fetchone()[0]
        parts = hint.split("|")  # scope, next scan from the start (epoch), priority, created_at
        parts[1] = "0"
        worker.execute("SELECT set_config('soniq.claim_hint', %s, false)", ["|".join(parts)])
        names, _ = claim_reading(worker)
        assert names == ["pinned.late"]


def test_a_lease_that_lapses_under_a_pinned_horizon_is_settled(pinned):
    with raw() as worker:
        run_through(PINNED_JOBS)
        enqueue(worker, 4, name="pinned.after")
        for _ in range(2):  # the probe for lapsed leases read them all, twice: it hints now
            claim_reading(worker)
        # A claim whose lease lapses after that, while the hints hold.
        [(lapsing,)] = worker.execute(
            "SELECT job_id FROM soniq_claim_many('other', %s::text[], NULL, 0.2)",
            [nonces(1)]).fetchall()
        time.sleep(0.5)
        names, read = claim_reading(worker)
        assert read["soniq_jobs_lease_idx"] < FEW, read
        assert worker.execute("SELECT status, attempts FROM soniq_jobs WHERE id = %s",
                              [lapsing]).fetchone() in (("queued", 1), ("processing", 2))


def test_without_a_pinned_horizon_claims_read_from_the_start(pinned):
    pinned.execute("ROLLBACK")  # no snapshot held: the dead entries can be marked dead
    pinned.execute("BEGIN")
    with raw() as worker:
        run_through(PINNED_JOBS)
        enqueue(worker, 3, name="pinned.after")
        wait_for_older_transactions(worker)  # another test run's may pin it too
        claim_reading(worker)  # marks what it reads dead for every snapshot
        for _ in range(2):
            names, read = claim_reading(worker)
            assert names == ["pinned.after"]
            assert read["soniq_jobs_claim_now_idx"] < FEW, read
        assert worker.execute("SELECT current_setting('soniq.claim_hint', true)").fetchone()[0] \
            in (None, "")
        assert worker.execute("SELECT current_setting('soniq.lapsed_hint', true)").fetchone()[0] \
            in (None, "")


def test_claims_that_find_nothing_under_a_pinned_horizon_read_little(pinned):
    # A worker that keeps up mostly finds the queue empty: its claims must not read
    # every entry since the pin either.
    run_through(PINNED_JOBS)
    with raw() as worker:
        enqueue(worker, 1, name="pinned.first")
        names, _ = claim_reading(worker)  # from the start: one job, and a suspicion
        assert names == ["pinned.first"]
        names, read = claim_reading(worker)  # from the start again, nothing: hints
        assert names == [] and read["soniq_jobs_claim_now_idx"] >= PINNED_JOBS
        for _ in range(3):
            names, read = claim_reading(worker)
            assert names == []
            assert read["soniq_jobs_claim_now_idx"] < FEW, read
        enqueue(worker, 1, name="pinned.next")
        names, read = claim_reading(worker)
        assert names == ["pinned.next"]
        assert read["soniq_jobs_claim_now_idx"] < FEW, read


def test_a_completion_under_a_pinned_horizon_finds_its_row_by_primary_key(pinned):
    """Version 11: a batch of one is written by primary key. Versions 2 to 10 let the
    planner take soniq_jobs_lease_idx (lease_expires_at > now), where a held snapshot keeps
    the processing version of every job finished since: a completion walked them all."""
    with raw() as worker, worker.cursor() as cursor:
        cursor.executemany("SELECT soniq_enqueue('pinned.job', jsonb_build_object('n', %s::int))",
                           [(n,) for n in range(PINNED_JOBS)])
        done = 0
        while done < PINNED_JOBS:  # leases of 60 s: still ahead when the last one is written
            claimed = worker.execute(
                "SELECT job_id::text, generation, token, queue "
                "FROM soniq_claim_many('w', %s::text[], NULL, 60)", [nonces(200)]).fetchall()
            worker.execute("SELECT soniq_complete_many(%s::text[], 'w', %s::bigint[], %s::text[], "
                           "%s::text[], array_fill(NULL::jsonb, ARRAY[%s]))",
                           [*[list(column) for column in zip(*claimed)], len(claimed)])
            done += len(claimed)
        enqueue(worker, 1, name="pinned.after")
        [(job_id, generation, token, queue)] = worker.execute(
            "SELECT job_id::text, generation, token, queue "
            "FROM soniq_claim_many('w', %s::text[], NULL, 60)", [nonces(1)]).fetchall()
        with worker.transaction():
            before = dict(worker.execute(READ).fetchall())
            [(completed,)] = worker.execute(
                "SELECT soniq_complete(%s, 'w', %s, %s, %s, '{\"ok\": true}'::jsonb)",
                [job_id, generation, token, queue]).fetchall()
            after = dict(worker.execute(READ).fetchall())
        assert completed is True
        read = after["soniq_jobs_lease_idx"] - before["soniq_jobs_lease_idx"]
        assert read < FEW, read
        assert worker.execute("SELECT status, result FROM soniq_jobs WHERE id = %s",
                              [job_id]).fetchone() == ("done", {"ok": True})


# -- Claim protocol v14: the probe from the start leaves the claim (decision 0053) --

#: A hinted session's next probe from the start comes this long after its last one (s).
CLAIM_FULL_PROBE_EVERY = 300


def lapsed_hint(conn):
    """The session's lapsed-lease hint: (scope, lower bound, next probe from the start)."""
    scope, after, full = conn.execute(
        "SELECT current_setting('soniq.lapsed_hint')").fetchone()[0].split("|")
    return scope, float(after), float(full)


def age_lapsed_hint(conn, seconds):
    """As if ``seconds`` had passed since the hint was written: its next probe from the start
    comes that much sooner (the bound is left: the claims move it themselves)."""
    scope, after, full = lapsed_hint(conn)
    conn.execute("SELECT set_config('soniq.lapsed_hint', %s, false)",
                 [f"{scope}|{after}|{full - seconds}"])


def test_a_hinted_session_probes_the_leases_from_the_start_only_every_300_s(pinned):
    with raw() as worker:
        run_through(PINNED_JOBS)
        enqueue(worker, 8, name="pinned.after")
        for _ in range(2):  # from the start, twice: then hinted
            claim_reading(worker)
        now = worker.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()[0]
        assert CLAIM_FULL_PROBE_EVERY - 5 < lapsed_hint(worker)[2] - float(now) \
            <= CLAIM_FULL_PROBE_EVERY
        # 35 s on (version 13 probed from the start after 30 s): still from the hint only.
        age_lapsed_hint(worker, 35)
        for _ in range(2):
            names, read = claim_reading(worker)
            assert names == ["pinned.after"]
            assert read["soniq_jobs_lease_idx"] < FEW, read
        # 300 s on: one probe from the start, and the next one 300 s later again.
        age_lapsed_hint(worker, CLAIM_FULL_PROBE_EVERY)
        names, read = claim_reading(worker)
        assert names == ["pinned.after"]
        assert read["soniq_jobs_lease_idx"] >= PINNED_JOBS
        now = worker.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()[0]
        assert lapsed_hint(worker)[2] - float(now) > CLAIM_FULL_PROBE_EVERY - 5
        names, read = claim_reading(worker)
        assert names == ["pinned.after"]
        assert read["soniq_jobs_lease_idx"] < FEW, read


@pytest.mark.parametrize("path", ["housekeeping", "claim"])
def test_a_lease_committed_late_under_a_pinned_horizon_is_settled(pinned, path):
    """A lease that ended before the hinted probes' lower bound, visible only once its
    claim commits later, is settled by soniq_settle_lapsed (the workers' housekeeping, once
    a minute) or else by the session's next probe from the start (within 300 s)."""
    with raw() as worker, raw() as slow:
        run_through(PINNED_JOBS)
        enqueue(worker, 6, name="pinned.after")
        for _ in range(2):
            claim_reading(worker)  # hinted from now on
        # Another worker's claim, with a lease of 0.2 s, commits late.
        slow.execute("BEGIN")
        [(late,)] = slow.execute(
            "SELECT job_id FROM soniq_claim_many('slow', %s::text[], NULL, 0.2)",
            [nonces(1)]).fetchall()
        time.sleep(1.5)
        claim_reading(worker)  # finds none: the bound moves past the late lease's end
        assert lapsed_hint(worker)[1] > slow.execute(
            "SELECT extract(epoch FROM lease_expires_at) FROM soniq_jobs WHERE id = %s",
            [late]).fetchone()[0]
        slow.execute("COMMIT")
        # The hinted probe cannot see it: it stays lapsed, unsettled.
        names, read = claim_reading(worker)
        assert read["soniq_jobs_lease_idx"] < FEW, read
        assert worker.execute("SELECT status, attempts FROM soniq_jobs WHERE id = %s",
                              [late]).fetchone() == ("processing", 1)
        if path == "housekeeping":
            assert worker.execute("SELECT soniq_settle_lapsed(300)").fetchone() == (1,)
            assert worker.execute("SELECT status, attempts FROM soniq_jobs WHERE id = %s",
                                  [late]).fetchone() == ("queued", 1)
            assert worker.execute("SELECT soniq_settle_lapsed(300)").fetchone() == (0,)
        else:  # a worker that only claims: its probe from the start, 300 s on
            age_lapsed_hint(worker, CLAIM_FULL_PROBE_EVERY)
            names, read = claim_reading(worker)
            assert read["soniq_jobs_lease_idx"] >= PINNED_JOBS
            assert worker.execute("SELECT status, attempts FROM soniq_jobs WHERE id = %s",
                                  [late]).fetchone() in (("queued", 1), ("processing", 2))

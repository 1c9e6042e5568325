"""The short chaos runs, inside the test suite (PostgreSQL pass).

The plain run: 1,000 jobs, 4 worker processes x 2 threads, two SIGKILLs and
one fast and one immediate PostgreSQL restart, on a private cluster this
test starts and deletes itself (never the suite's server). The checker must
find nothing lost, nothing completed twice and no stale write applied. Then,
on the same database and inside transactions that are rolled back, the
checker is shown bugs of each kind and must report every one: a checker
that cannot fail proves nothing.

The effects run: 500 atomic ``chaos.effect`` jobs (tests/chaos/effects.py),
each writing one effect row in its job's transaction and sleeping 50-500 ms,
through a SIGKILL, a fast and an immediate restart, a worker SIGSTOPped past
its lease mid-run and resumed, and two rounds of terminated backends. Every
job must have exactly one effect row, of the generation whose completion
landed; the stopped worker's claims none and no completion. Then the checker
is shown a duplicated, a missing and a stale effect row, an effect and a
completion of the stopped claim, and must report each.

The liveness run (tests/chaos/liveness.py, issue 26): one round of each
fault on a worker with 4 long jobs running (lease 2 s): a limited queue's
settings row locked for 3 leases, an atomic job's COMMIT lost with the
backend left idle in transaction, the worker's shared connection's backend
SIGSTOPped for 2 leases. Every job must run once (the lost COMMIT's job
may run once more, its effect lands once), every job finish within 6 leases
of its fault, and the other queue's jobs enqueued during a fault start
within 1.5 leases.

The workflows run (tests/chaos/workflows.py, issue 29): two batches of 200
members with an ``on_complete`` callback each and 200 jobs in a random DAG
of dependencies (chains, fan-in, jobs after a callback; some jobs failing
for good), through a SIGKILL, a fast restart, a worker SIGSTOPped past its
lease and a round of terminated backends. Every callback must complete
exactly once, after its last member ended; no dependent start before its
dependencies completed; every dependent of a failed job be cancelled with
``dependency_failed:<id>``; nothing be lost. Then the checker is shown a
callback completed twice and run early, a dependent run early, a wrong
cancellation and a leftover counter, and must report each.

The full runs are ``python -m tests.chaos`` (``make chaos``). Under CI=true a
machine that cannot host the private cluster fails this test; elsewhere it
is skipped with the reason.
"""

import dataclasses
import time

import psycopg
import pytest

from tests.chaos.checker import Report, check
from tests.support.ci import unavailable
from tests.chaos.cluster import Cluster, ClusterUnavailable
from tests.chaos.driver import Config, Outcome, effects_config, keys_config, run, workflows_config
from tests.chaos.workflows import check_workflows, expected_endings
from tests.chaos.liveness import LivenessConfig
from tests.chaos.liveness import run as run_liveness

# Crash recovery of the claim protocol: run in the Django 5.2 passes only.
pytestmark = [pytest.mark.postgresql_only, pytest.mark.version_independent]


SHORT = Config(
    jobs=1000, workers=4, concurrency=2, kills=2, fast_restarts=1, immediate_restarts=1,
    job_seconds=(0.01, 0.12), long_fraction=0.02, downtime=(0.5, 2.5), long_outages=0,
    window=(0.1, 0.7),
    drain_timeout=150.0, stall_timeout=60.0,
)


def _require_a_private_cluster() -> None:
    """Skip (outside CI) or fail (under CI=true) when no private cluster can be started."""
    try:
        Cluster()  # finds initdb/pg_ctl and the OS user; creates nothing
    except ClusterUnavailable as error:
        message = f"the chaos run cannot start its own PostgreSQL cluster: {error}"
        unavailable(message)


EFFECTS_SHORT = effects_config(
    jobs=500, workers=4, concurrency=2, kills=1, fast_restarts=1, immediate_restarts=1,
    stops=1, terminations=2, downtime=(0.5, 2.0), long_outages=0, window=(0.05, 0.6),
    drain_timeout=150.0, stall_timeout=60.0,
)


def _checked_after(url: str, *steps, **check_args) -> Report:
    """The checker's report on the database with ``steps`` applied, then rolled back."""
    with psycopg.connect(url) as conn:
        try:
            for sql, params in steps:
                conn.execute(sql, params)
            return check(conn, **check_args)
        finally:
            conn.rollback()


def _show_the_checker_bugs(url: str, outcome: Outcome) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        job_id, generation, exec_id = conn.execute(
            "SELECT id, claim_generation, (result ->> 'exec')::uuid FROM soniq_jobs "
            "WHERE status = 'done' ORDER BY claim_generation DESC, id LIMIT 1").fetchone()

    # A job row disappears: lost.
    lost = _checked_after(url, ("DELETE FROM soniq_jobs WHERE id = %s", (job_id,)))
    assert lost.lost == 1 and not lost.ok

    # An older execution's result overwrites the job: a second completion, stale.
    stale = _checked_after(
        url,
        ("SELECT set_config('soniq.fenced_write', 'on', true)", None),
        ("UPDATE soniq_jobs SET status = 'processing' WHERE id = %s", (job_id,)),
        ("UPDATE soniq_jobs SET status = 'done', result = jsonb_set(result, '{generation}', "
         "to_jsonb(claim_generation - 1)) WHERE id = %s", (job_id,)),
    )
    assert stale.stale_writes_applied >= 2 and stale.double_completions == 1

    # The same claim runs twice.
    twice = _checked_after(url, (
        "INSERT INTO chaos_executions SELECT gen_random_uuid(), job_id, attempt, pid, worker_id,"
        " row_generation, row_owner, row_status, row_lease, started_at + interval '1 ms', "
        "finished_at FROM chaos_executions WHERE exec_id = %s", (exec_id,)))
    assert any(f"generation {generation} ran 2 times" in v for v in twice.violations)

    # A job runs again although its claim completed and nothing re-claimed it.
    rerun = _checked_after(url, (
        "INSERT INTO chaos_executions (exec_id, job_id, attempt, pid, started_at) "
        "VALUES (gen_random_uuid(), %s, %s, 1, clock_timestamp())", (job_id, generation + 1)))
    assert rerun.unexplained_duplicates == 1 and not rerun.ok

    # Untouched, the same database checks clean.
    assert _checked_after(url).ok


def test_short_chaos_run_loses_nothing_and_applies_no_stale_write(tmp_path):
    _require_a_private_cluster()
    started = time.monotonic()
    outcome = run(dataclasses.replace(SHORT, log_dir=tmp_path), say=print,
                  inspect=_show_the_checker_bugs)
    elapsed = time.monotonic() - started
    print(outcome.summary())
    print(f"short chaos run: {elapsed:.1f} s")
    assert outcome.ok, "\n".join(outcome.failures()[:40])

    facts, report = outcome.facts, outcome.report
    assert facts.kills >= 2 and facts.restarts_fast >= 1 and facts.restarts_immediate >= 1
    assert report.enqueued == SHORT.jobs
    assert report.done + report.dead_lettered == SHORT.jobs
    assert report.lost == 0 and report.unfinished == 0
    assert report.stale_writes_applied == 0 and report.double_completions == 0
    assert report.completions_applied == report.done
    assert report.executions >= SHORT.jobs
    assert report.unexplained_duplicates == 0
    assert report.duplicate_executions == report.reruns_after_lapse + report.reruns_after_failure
    assert report.duplicates_earlier_generation_lower == report.duplicate_executions


def _show_the_checker_effect_bugs(url: str, outcome: Outcome) -> None:
    stopped = outcome.facts.stopped_claims
    args = {"effects": True, "stopped": stopped}
    with psycopg.connect(url, autocommit=True) as conn:
        job_id, generation = conn.execute(
            "SELECT j.id, j.claim_generation FROM soniq_jobs AS j WHERE j.status = 'done' "
            "ORDER BY j.id LIMIT 1").fetchone()
    stopped_job, stopped_generation = stopped[0]["job_id"], stopped[0]["generation"]

    # A second effect row of the run whose completion landed: the effect ran twice.
    twice = _checked_after(url, (
        "INSERT INTO chaos_effects (job_id, generation, exec_id, backend_pid) SELECT job_id, "
        "generation, exec_id, backend_pid FROM chaos_effects WHERE job_id = %s", (job_id,)),
        **args)
    assert (twice.effects_not_once, twice.effects_not_landed) == (1, 0)
    assert twice.effects_per_job[2] == 1 and not twice.ok

    # A job's effect row is missing: its writes did not commit with its completion.
    missing = _checked_after(url, ("DELETE FROM chaos_effects WHERE job_id = %s", (job_id,)),
                             **args)
    assert missing.effects_not_once == 1 and missing.effects_per_job[0] == 1

    # An effect of another generation than the one that completed: a refused run's write.
    stale = _checked_after(url, (
        "UPDATE chaos_effects SET generation = generation + 1 WHERE job_id = %s", (job_id,)),
        **args)
    assert stale.effects_not_landed == 1 and stale.effects_of_stopped == 0 and not stale.ok

    # The stopped claim's write landed after all ...
    of_stopped = _checked_after(url, (
        "INSERT INTO chaos_effects (job_id, generation, exec_id, backend_pid) "
        "VALUES (%s, %s, gen_random_uuid(), 0)", (stopped_job, stopped_generation)), **args)
    assert of_stopped.effects_of_stopped == 1 and of_stopped.effects_not_landed == 1

    # ... or its late completion did.
    late = _checked_after(url, (
        "INSERT INTO chaos_writes (job_id, op, old_status, new_status, old_generation, "
        "new_generation, result_generation) VALUES (%s, 'update', 'processing', 'done', "
        "%s, %s, %s)", (stopped_job, stopped_generation, stopped_generation, stopped_generation)),
        **args)
    assert late.stopped_completions_applied == 1 and late.double_completions == 1

    # Untouched, the same database checks clean.
    assert _checked_after(url, **args).ok


def test_short_effects_run_lands_each_jobs_effect_exactly_once(tmp_path):
    _require_a_private_cluster()
    started = time.monotonic()
    outcome = run(dataclasses.replace(EFFECTS_SHORT, log_dir=tmp_path), say=print,
                  inspect=_show_the_checker_effect_bugs)
    elapsed = time.monotonic() - started
    print(outcome.summary())
    print(f"short effects chaos run: {elapsed:.1f} s")
    assert outcome.ok, "\n".join(outcome.failures()[:40])

    facts, report = outcome.facts, outcome.report
    assert facts.kills >= 1 and facts.restarts_fast >= 1 and facts.restarts_immediate >= 1
    assert facts.stops == 1 and facts.backends_terminated >= 1
    assert any(claim["effect_written"] for claim in facts.stopped_claims)
    assert report.stopped_claims == len(facts.stopped_claims)
    assert report.stopped_completions_applied == 0
    assert report.done == report.enqueued == EFFECTS_SHORT.jobs and report.lost == 0
    assert report.stale_writes_applied == 0 and report.double_completions == 0
    assert report.effects_rows == EFFECTS_SHORT.jobs
    assert dict(report.effects_per_job) == {1: EFFECTS_SHORT.jobs}
    assert report.effects_not_once == 0 and report.effects_not_landed == 0
    # A stopped claim that had written its effect left it uncommitted: rolled back.
    assert report.effects_rolled_back >= 1
    assert report.unexplained_duplicates == 0


def test_short_liveness_run_runs_each_job_once_through_locks_lost_commits_and_stalls(tmp_path):
    _require_a_private_cluster()
    started = time.monotonic()
    outcome = run_liveness(LivenessConfig(log_dir=tmp_path), say=print)
    print(outcome.summary())
    print(f"short liveness run: {time.monotonic() - started:.1f} s")
    assert outcome.ok, "\n".join(outcome.violations[:40])
    assert [r.fault for r in outcome.rounds] == ["lock", "commit", "stall"]
    assert all(r.injected and r.settled for r in outcome.rounds)
    lost = outcome.rounds[1].lost_commit
    assert lost is not None and outcome.executions[lost] in (1, 2)


WORKFLOWS_SHORT = workflows_config(
    batches=2, batch_size=200, dag_jobs=200, workers=4, concurrency=2, kills=1,
    fast_restarts=1, immediate_restarts=0, stops=1, terminations=1, job_seconds=(0.03, 0.2),
    long_fraction=0.0, fail_fraction=0.03, downtime=(0.5, 1.5), long_outages=0,
    window=(0.05, 0.4), drain_timeout=150.0, stall_timeout=60.0,
)


def _workflow_report(url: str, *steps):
    """The base and workflow checkers' reports with ``steps`` applied, then rolled back."""
    with psycopg.connect(url) as conn:
        try:
            for sql, params in steps:
                conn.execute(sql, params)
            report = check(conn, expected=expected_endings(conn))
            return report, check_workflows(conn, report)
        finally:
            conn.rollback()


def _show_the_checker_workflow_bugs(url: str, outcome: Outcome) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        callback, batch = conn.execute(
            "SELECT job_id, batch FROM chaos_workflow WHERE kind = 'callback' "
            "ORDER BY job_id LIMIT 1").fetchone()
        member_done = conn.execute(
            "SELECT w.at FROM chaos_writes AS w JOIN chaos_workflow AS c ON c.job_id = w.job_id "
            "WHERE c.kind = 'member' AND c.batch = %s AND w.new_status = 'done' "
            "ORDER BY w.at DESC LIMIT 1", (batch,)).fetchone()[0]
        dependent, dependency = conn.execute(
            "SELECT c.job_id, c.deps[1] FROM chaos_workflow AS c JOIN soniq_jobs AS j "
            "ON j.id = c.job_id WHERE j.status = 'done' AND cardinality(c.deps) > 0 "
            "ORDER BY c.job_id LIMIT 1").fetchone()
        cancelled = conn.execute(
            "SELECT id FROM soniq_jobs WHERE status = 'cancelled' ORDER BY id LIMIT 1"
        ).fetchone()[0]

    # The callback's completion applied a second time: the chord fired twice.
    twice, flows = _workflow_report(url, (
        "INSERT INTO chaos_writes (job_id, op, old_status, new_status, old_generation, "
        "new_generation, result_generation) SELECT id, 'update', 'processing', 'done', "
        "claim_generation, claim_generation, claim_generation FROM soniq_jobs WHERE id = %s",
        (callback,)))
    assert flows.callbacks_completed_once == flows.batches - 1 and not twice.ok

    # The callback ran before its last member ended: the chord fired early.
    early, flows = _workflow_report(url, (
        "INSERT INTO chaos_executions (exec_id, job_id, attempt, pid, started_at) VALUES "
        "(gen_random_uuid(), %s, 0, 1, %s - interval '1 ms')", (callback, member_done)))
    assert flows.callbacks_early == 1 and not early.ok

    # A dependent started before its dependency's completion.
    before, flows = _workflow_report(url, (
        "UPDATE chaos_executions SET started_at = (SELECT min(at) - interval '1 ms' "
        "FROM chaos_writes WHERE job_id = %s AND new_status = 'done') WHERE job_id = %s",
        (dependency, dependent)))
    assert flows.dependents_early == 1 and not before.ok

    # A job cancelled for a reason other than a failed dependency of its own.
    wrong, flows = _workflow_report(url, (
        "UPDATE soniq_jobs SET last_error = 'dependency_failed:' || %s WHERE id = %s",
        (str(dependent), cancelled)))
    assert flows.cancelled_bad == 1 and not wrong.ok

    # A waits counter left behind: a dependent that would never be released.
    left, flows = _workflow_report(url, (
        "INSERT INTO soniq_job_waits (job_id, pending, run_at, created_at) "
        "VALUES (%s, 1, NULL, now())",
        (dependent,)))
    assert flows.counters_left == 1 and not left.ok

    # Untouched, the same database checks clean.
    clean, flows = _workflow_report(url)
    assert clean.ok and flows.callbacks_completed_once == flows.batches


def test_short_workflows_run_fires_each_callback_once_and_no_dependent_early(tmp_path):
    _require_a_private_cluster()
    started = time.monotonic()
    outcome = run(dataclasses.replace(WORKFLOWS_SHORT, log_dir=tmp_path), say=print,
                  inspect=_show_the_checker_workflow_bugs)
    print(outcome.summary())
    print(f"short workflows chaos run: {time.monotonic() - started:.1f} s")
    assert outcome.ok, "\n".join(outcome.failures()[:40])

    facts, report, flows = outcome.facts, outcome.report, outcome.workflows
    assert facts.kills >= 1 and facts.restarts_fast == 1 and facts.stops == 1
    assert flows.batches == 2 and flows.members == 400 and flows.dag_jobs == 200
    assert flows.callbacks_completed_once == 2 and flows.callbacks_early == 0
    assert flows.dependents_early == 0 and flows.not_as_expected == 0
    assert flows.cancelled_bad == 0 and flows.cancelled_ran == 0 and flows.counters_left == 0
    assert flows.expected["dead_letter"] >= 1 and flows.expected["cancelled"] >= 1
    assert report.lost == 0 and report.unfinished == 0 and report.double_completions == 0
    assert report.done + report.dead_lettered + report.cancelled == report.enqueued == 602
    assert report.unexplained_duplicates == 0 and report.stale_writes_applied == 0


KEYS_SHORT = keys_config(
    jobs=150, keys=10, workers=3, concurrency=3, kills=1, fast_restarts=0, stops=1,
    terminations=1, job_seconds=(0.02, 0.15), timeout_fraction=0.05, flaky_fraction=0.05,
    drain_timeout=150.0, stall_timeout=60.0,
)


def _show_the_checker_a_key_overlap(url: str, outcome) -> None:
    """Inside a rolled-back transaction: two runs of one key made to overlap, a key left
    counting; the keys check must report both."""
    from tests.chaos.keys import check_keys

    with psycopg.connect(url) as conn:
        try:
            first, second = conn.execute(
                "SELECT e.exec_id, e.started_at, e.job_id, e.attempt FROM chaos_executions AS e "
                "JOIN soniq_jobs AS j ON j.id = e.job_id WHERE j.concurrency_key = 'k0' "
                "ORDER BY e.started_at LIMIT 2").fetchall()
            conn.execute("UPDATE chaos_executions SET finished_at = %s + interval '1 hour' "
                         "WHERE exec_id = %s", [first[1], first[0]])
            # Its hold given back a second in, its lease still running: no lapse, so the
            # run still held its key (only a lapsed hold ends a run early).
            conn.execute("DELETE FROM chaos_hold_ends WHERE job_id = %s", [first[2]])
            conn.execute("INSERT INTO chaos_hold_ends (job_id, generation, lease_expires_at, at) "
                         "VALUES (%s, %s, %s + interval '1 minute', %s + interval '1 second')",
                         [first[2], first[3], first[1], first[1]])
            conn.execute("UPDATE soniq_key_slots SET running = 1 WHERE key = 'k1'")
            found = check_keys(conn)
            # The same hold lapsed instead, as the run started (deleted at its lease's end):
            # the run gave its key back then, and the overlap made above is gone.
            conn.execute("UPDATE chaos_hold_ends SET lease_expires_at = %s, at = %s "
                         "WHERE job_id = %s", [first[1], first[1], first[2]])
            cut = check_keys(conn)
        finally:
            conn.rollback()
    assert found.overlaps >= 1, found.violations
    assert any("still counting" in line for line in found.leftovers), found.leftovers
    assert cut.overlaps == found.overlaps - 1, cut.violations
    assert cut.runs_cut_by_hold_lapse == found.runs_cut_by_hold_lapse + 1


def test_short_keys_run_never_runs_two_jobs_of_a_key_at_once(tmp_path):
    _require_a_private_cluster()
    started = time.monotonic()
    outcome = run(dataclasses.replace(KEYS_SHORT, log_dir=tmp_path), say=print,
                  inspect=_show_the_checker_a_key_overlap)
    print(outcome.summary())
    print(f"short keys chaos run: {time.monotonic() - started:.1f} s")
    assert outcome.ok, "\n".join(outcome.failures()[:40])
    facts, keyed = outcome.facts, outcome.keys
    assert facts.kills >= 1 and facts.stops + facts.stops_missed == 1
    assert keyed.keys == 10 and keyed.overlaps == 0 and not keyed.leftovers
    assert outcome.report.done == KEYS_SHORT.jobs

"""The short steps chaos run, inside the test suite (PostgreSQL pass; issue 30).

40 ``chaos.steps`` jobs of five atomic durable steps (tests/chaos/step_jobs.py),
each step writing one effect row in its own transaction, through a SIGKILL, a
fast restart, a worker SIGSTOPped past its lease mid-step and two rounds of
terminated backends. Every job must end done with its five steps recorded, each
(job, step) with exactly one effect row -- the recording run's -- and no step's
function called by a run after its record committed. Then, on the same database
and inside transactions rolled back, the checker is shown a duplicated effect,
an effect of another run, a missing record and a call after the record, and
must report each. The full run is ``make chaos-steps``; the control
(``--steps --control``, plain steps) fails with duplicates.
"""

import dataclasses
import time

import psycopg
import pytest

from tests.chaos.driver import steps_config, run
from tests.chaos.steps import check_steps
from tests.chaos.test_chaos_short import _require_a_private_cluster

pytestmark = [pytest.mark.postgresql_only, pytest.mark.version_independent]

STEPS_SHORT = steps_config(
    jobs=40, workers=3, concurrency=2, kills=1, fast_restarts=1, immediate_restarts=0,
    stops=1, terminations=2, job_seconds=(0.5, 1.5), downtime=(0.5, 1.5), long_outages=0,
    window=(0.1, 0.6), drain_timeout=150.0, stall_timeout=60.0,
)


def _steps_report(url: str, *changes):
    with psycopg.connect(url) as conn:
        try:
            for sql, params in changes:
                conn.execute(sql, params)
            return check_steps(conn)
        finally:
            conn.rollback()


def _show_the_checker_step_bugs(url: str, outcome) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        job_id, generation = conn.execute(
            "SELECT job_id, generation FROM soniq_job_steps WHERE name = 's1' "
            "ORDER BY job_id LIMIT 1").fetchone()
    effect = ("INSERT INTO chaos_step_effects (job_id, step, generation, exec_id, backend_pid) "
              "VALUES (%s, 1, %s, gen_random_uuid(), 0)")
    twice = _steps_report(url, (effect, (job_id, generation)))
    assert twice.not_once == 1 and twice.violations
    other = _steps_report(url, ("DELETE FROM chaos_step_effects WHERE job_id = %s AND step = 1",
                                (job_id,)), (effect, (job_id, generation + 1)))
    assert other.effect_of_another_run == 1
    missing = _steps_report(url, ("DELETE FROM soniq_job_steps WHERE job_id = %s AND name = 's1'",
                                  (job_id,)))
    assert missing.missing_records == 1
    late = _steps_report(url, ("INSERT INTO chaos_step_calls (job_id, step, generation, exec_id) "
                               "VALUES (%s, 1, %s, gen_random_uuid())", (job_id, generation + 1)))
    assert late.called_after_record == 1


def test_short_steps_run_lands_each_step_effect_once(tmp_path):
    _require_a_private_cluster()
    started = time.monotonic()
    outcome = run(dataclasses.replace(STEPS_SHORT, log_dir=tmp_path), say=print,
                  inspect=_show_the_checker_step_bugs)
    print(outcome.summary())
    print(f"short steps chaos run: {time.monotonic() - started:.1f} s")
    assert outcome.ok, "\n".join(outcome.failures()[:40])
    facts, report, steps = outcome.facts, outcome.report, outcome.steps
    assert facts.kills >= 1 and facts.restarts_fast == 1 and facts.stops == 1
    assert report.done == report.enqueued == 40 and report.lost == 0
    assert steps.records == 200 and steps.effects == 200 and steps.effects_per_step == {1: 200}
    assert steps.not_once == steps.called_after_record == steps.effect_of_another_run == 0

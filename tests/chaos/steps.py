"""The steps scenario's checker (``python -m tests.chaos --steps``; the handler: step_jobs.py).

``check_steps`` proves from the chaos database, per enqueued job: every step
recorded once, its effect row (``chaos_step_effects``) exactly once and of the
run that recorded it, and no step's function called (``chaos_step_calls``) by
a run later than the one whose record committed. Imports nothing of Django: the
driver runs it.
"""

from dataclasses import dataclass, field

#: The steps of each chaos.steps job: s0 .. s4.
STEPS = 5


@dataclass
class StepsReport:
    jobs: int = 0
    records: int = 0
    calls: int = 0
    calls_not_recorded: int = 0  # calls whose run did not record the step (retried)
    effects: int = 0
    effects_per_step: dict[int, int] = field(default_factory=dict)  # rows -> (job, step)s
    not_once: int = 0
    effect_of_another_run: int = 0
    called_after_record: int = 0
    missing_records: int = 0
    violations: list[str] = field(default_factory=list)


def check_steps(conn) -> StepsReport:
    """The steps scenario's proof, from the database behind ``conn`` (psycopg)."""
    report = StepsReport()
    with conn.cursor() as cursor:
        cursor.execute("SELECT job_id FROM chaos_enqueued")
        enqueued = [row[0] for row in cursor.fetchall()]
        cursor.execute("SELECT job_id, name, generation FROM soniq_job_steps")
        records = {(j, int(name[1:])): g for j, name, g in cursor.fetchall()}
        cursor.execute("SELECT job_id, step, generation FROM chaos_step_calls")
        calls = cursor.fetchall()
        cursor.execute("SELECT job_id, step, generation FROM chaos_step_effects")
        effects = cursor.fetchall()
    report.jobs, report.records, report.calls = len(enqueued), len(records), len(calls)
    report.effects = len(effects)
    landed: dict[tuple, list[int]] = {}
    for job_id, step, generation in effects:
        landed.setdefault((job_id, step), []).append(generation)
    for job_id in enqueued:
        for k in range(STEPS):
            rows = landed.get((job_id, k), [])
            report.effects_per_step[len(rows)] = report.effects_per_step.get(len(rows), 0) + 1
            recorded = records.get((job_id, k))
            if recorded is None:
                report.missing_records += 1
                report.violations.append(f"{job_id} s{k}: never recorded")
                continue
            if len(rows) != 1:
                report.not_once += 1
                report.violations.append(f"{job_id} s{k}: {len(rows)} effect rows")
            elif rows[0] != recorded:
                report.effect_of_another_run += 1
                report.violations.append(f"{job_id} s{k}: the effect of generation {rows[0]}, "
                                         f"recorded by generation {recorded}")
    for job_id, step, generation in calls:
        recorded = records.get((job_id, step))
        if recorded is not None and generation > recorded:
            report.called_after_record += 1
            report.violations.append(f"{job_id} s{step}: called by generation {generation} "
                                     f"after generation {recorded}'s record committed")
        elif recorded is None or generation != recorded:
            report.calls_not_recorded += 1
    return report


def summary_lines(r: StepsReport) -> list[str]:
    per_step = ", ".join(f"{rows} row{'s' if rows != 1 else ''}: {count}"
                         for rows, count in sorted(r.effects_per_step.items()))
    return [
        f"  steps:                   {r.jobs} jobs x {STEPS}; {r.records} recorded, "
        f"{r.missing_records} never recorded",
        f"  step calls:              {r.calls} ({r.calls_not_recorded} by a run that did not "
        f"record the step: crashed, stopped, cut off or refused)",
        f"  step effects:            {r.effects} rows ({per_step}); (job, step)s without "
        f"exactly one: {r.not_once}; of another run than the recording one: "
        f"{r.effect_of_another_run}",
        f"  called after its record: {r.called_after_record}",
    ]

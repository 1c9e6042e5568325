"""The chaos checker: what the database proves after a chaos run.

Inputs, all read from the chaos database after the workers stopped:

- ``chaos_enqueued``: every job id the run committed;
- ``soniq_jobs`` and ``soniq_dead_letter_jobs``: where each job ended;
- ``chaos_executions``: every handler execution, recorded by the handler in
  its own transaction before it did anything (tests/chaos/jobs.py);
- ``chaos_writes``: every applied write that changed a job's status or
  generation, or deleted it, audited by triggers in the writing transaction
  (tests/chaos/schema.py);

and, from the driver, when the database restarted and which worker
processes lived through each restart.

It proves:

1. **Nothing lost.** Every enqueued id ends in exactly one place: ``done`` in
   soniq_jobs, or in the dead letters. None is queued, processing,
   cancelled or missing.
2. **At most one completion per job.** Exactly one applied
   processing→done write per done job, none for the others, and no write
   ever moved a finished row again.
3. **No stale write applied.** Every applied completion carries (in its
   result) the generation of the claim it was applied to; every applied
   failure names that generation in its error; each final row's result
   generation equals its claim_generation. A write produced by an older
   execution would carry a lower generation. (One kind of failure names no
   generation: the worker's own, for an atomic run that ended outside its
   handler -- its transaction could not begin, its completion or COMMIT
   failed. Those are counted, ``atomic_failures_reported``; that they belong
   to the claim they were applied to rests on the fence alone.)
4. **Claims are fenced.** Each claim raised the generation by exactly one;
   no claim ran twice (one execution per job and generation at most); each
   execution ran under a claim that existed and was owned by its worker.
5. **Extra executions only after the earlier claim ended.** For each job's
   executions in generation order, the earlier claim ended by a lease lapse
   (the reaper re-queued it, and only after its lease had run out) or by a
   failure that claim itself reported, before the later execution started.
6. **Workers recover.** Every worker process that lived through a database
   restart ran jobs again after it.
7. **A stopped worker's late completions are refused.** No claim a worker
   held while it was SIGSTOPped past its lease (``stopped``, from the driver)
   was completed.

In the effects scenario (``effects=True``; tests/chaos/effects.py), from
``chaos_effects`` -- the handler's own write inside the atomic job's
transaction, no unique constraint -- it also proves:

8. **Effects exactly once.** Every done job has exactly one effect row, and
   that row's generation is the one whose completion landed (the applied
   completion's, the final claim generation, the result's) and names the
   execution the result names. A job that did not end done has none.
9. **No effect of a refused run.** No effect row of any other generation:
   none from a run whose fence was refused (a lapsed lease, the SIGSTOPped
   claims above), from a run that failed, or from one whose connection was
   terminated.

In the workflows scenario (``expected``: job id -> the ending its plan gives
it; tests/chaos/workflows.py) a job planned to fail for good may end in the
dead letters and one planned to be cancelled by a failed dependency may end
``cancelled`` (by the queued -> cancelled write of the dependency's
trigger); every other rule holds as stated, and workflows.py's checker adds
the workflow proofs.

Executions beyond one per job are counted, not failed (they happen; their
effects do not land), and so are the effects written by runs whose
completion did not land (``effects_rolled_back``: noted by the handler over
its own connection, absent from ``chaos_effects``).
"""

import datetime as dt
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field

LAPSE_ERROR = "lease lapsed"
#: How the worker's own failure texts for an atomic run begin (soniq_django/worker/atomic.py,
#: writes.py): the run ended outside its handler -- its transaction could not begin, its
#: completion or its COMMIT failed -- and nothing it wrote was kept.
ATOMIC_WORKER_ERRORS = ("the atomic run", "the commit of this atomic run")
#: The head of the failure the worker writes at a run's time limit (worker/timeouts.py): the
#: keys scenario's overrunning jobs (tests/chaos/keys.py).
TIMEOUT_ERROR = "timed out after "


@dataclass
class Report:
    enqueued: int = 0
    done: int = 0
    dead_lettered: int = 0
    cancelled: int = 0  # workflows: cancelled by a failed dependency, as planned
    lost: int = 0
    unfinished: int = 0
    executions: int = 0
    duplicate_executions: int = 0
    reruns_after_lapse: int = 0
    reruns_after_failure: int = 0
    duplicates_earlier_generation_lower: int = 0
    unexplained_duplicates: int = 0
    completions_applied: int = 0
    double_completions: int = 0
    stale_writes_applied: int = 0
    stale_results_refused: int = 0  # ran to the end, claim gone, result never applied
    claims: int = 0
    claims_never_run: int = 0
    lease_lapses: int = 0
    failures_reported: int = 0
    atomic_failures_reported: int = 0  # by the worker: an atomic run's completion/COMMIT failed
    owned_row_reads: int = 0
    workers_not_recovered: int = 0
    stopped_claims: int = 0
    stopped_completions_applied: int = 0
    effects_checked: bool = False
    effects_rows: int = 0
    effects_per_job: Counter = field(default_factory=Counter)  # rows per job -> jobs
    effects_not_once: int = 0        # jobs without one effect row (done) or none (not done)
    effects_not_landed: int = 0      # rows of a generation whose completion did not land
    effects_of_stopped: int = 0      # ... of them, rows of a claim held while SIGSTOPped
    effects_rolled_back: int = 0     # effects noted by their run, not in chaos_effects
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def violation(self, text: str) -> None:
        if len(self.violations) < 200:
            self.violations.append(text)
        elif len(self.violations) == 200:
            self.violations.append("... (more violations not listed)")


def _rows(conn, sql: str, params=None) -> list[dict]:
    cursor = conn.execute(sql, params)
    names = [column.name for column in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


def check(conn, *, restarts: list[dict] | None = None,
          survivors: dict[str, tuple[float, float]] | None = None,
          effects: bool = False, stopped: list[dict] | None = None,
          expected: dict | None = None) -> Report:
    """Check the chaos database behind ``conn`` (psycopg, any transaction state).

    ``restarts``: ``{"mode", "down", "up"}`` (unix times) per database restart.
    ``survivors``: worker id → (start, end) unix times of processes that were
    not killed (end: when the drain was over).
    ``effects``: the run was the effects scenario; check ``chaos_effects`` too.
    ``stopped``: ``{"job_id", "generation", ...}`` per claim a worker held
    while it was SIGSTOPped past its lease.
    ``expected``: the workflows scenario's planned endings (job id -> ``done``,
    ``dead_letter`` or ``cancelled``).
    """
    expected = expected or {}
    report = Report()
    enqueued = {row["job_id"] for row in _rows(conn, "SELECT job_id FROM chaos_enqueued")}
    jobs = {row["id"]: row for row in _rows(
        conn, "SELECT j.id, j.status, j.attempts, j.claim_generation, j.result, j.claim_owner "
              "FROM soniq_jobs AS j JOIN chaos_enqueued AS e ON e.job_id = j.id")}
    dead = {row["id"]: row for row in _rows(
        conn, "SELECT d.id, d.attempts, d.dead_letter_reason, right(d.last_error, 200) AS err "
              "FROM soniq_dead_letter_jobs AS d JOIN chaos_enqueued AS e ON e.job_id = d.id")}
    executions = _rows(conn, "SELECT * FROM chaos_executions ORDER BY started_at")
    writes = _rows(conn, "SELECT * FROM chaos_writes ORDER BY id")

    # 1. Nothing lost ----------------------------------------------------------
    report.enqueued = len(enqueued)
    report.done = sum(1 for row in jobs.values() if row["status"] == "done")
    report.dead_lettered = len(dead)
    for job_id in enqueued:
        if job_id in jobs and job_id in dead:
            report.violation(f"{job_id} is both a job and a dead letter")
        elif job_id not in jobs and job_id not in dead:
            report.lost += 1
            report.violation(f"{job_id} lost: neither in soniq_jobs nor in the dead letters")
    for job_id, row in jobs.items():
        if row["status"] == "cancelled" and expected.get(job_id) == "cancelled":
            report.cancelled += 1
        elif row["status"] != "done":
            report.unfinished += 1
            report.violation(f"{job_id} ended {row['status']!r}, not done")
    for job_id, row in dead.items():
        if expected.get(job_id) == "dead_letter":
            continue
        report.violation(f"{job_id} dead-lettered ({row['dead_letter_reason']}): {row['err']!r}")

    # The basis of reading a claim's generation from current_job().attempts.
    for job_id, row in jobs.items():
        if row["attempts"] != row["claim_generation"]:
            report.violation(f"{job_id}: attempts {row['attempts']} != generation "
                             f"{row['claim_generation']}")

    # 2-3. Audited writes -------------------------------------------------------
    claims: dict[tuple, dict] = {}            # (job, generation) -> the claim's audit row
    claim_end: dict[tuple, dict] = {}         # (job, generation) -> how that claim ended
    completions = Counter()
    for write in writes:
        job_id = write["job_id"]
        old, new = write["old_status"], write["new_status"]
        if write["op"] == "delete":
            if old == "processing":  # moved to the dead letters by a fenced fail or the reaper
                claim_end[(job_id, write["old_generation"])] = write
                carried = write["error_generation"]
                if carried is not None and carried != write["old_generation"]:
                    report.stale_writes_applied += 1
                    report.violation(f"{job_id}: dead-lettered by generation {carried} while "
                                     f"the row was at {write['old_generation']}")
            else:
                report.violation(f"{job_id}: a {old!r} row was deleted")
            continue
        if write["new_generation"] != write["old_generation"]:
            if (old, new) != ("queued", "processing") or (
                    write["new_generation"] != write["old_generation"] + 1):
                report.violation(f"{job_id}: generation {write['old_generation']} -> "
                                 f"{write['new_generation']} on {old} -> {new}")
        if (old, new) == ("queued", "processing"):
            report.claims += 1
            claims[(job_id, write["new_generation"])] = write
        elif old == "processing" and new == "done":
            completions[job_id] += 1
            report.completions_applied += 1
            carried = write["result_generation"]
            if carried != write["old_generation"] or carried != write["new_generation"]:
                report.stale_writes_applied += 1
                report.violation(f"{job_id}: completion carrying generation {carried} applied "
                                 f"to generation {write['old_generation']}")
            claim_end[(job_id, write["old_generation"])] = write
        elif old == "processing" and new == "queued":
            claim_end[(job_id, write["old_generation"])] = write
            carried = write["error_generation"]
            if carried is not None:
                report.failures_reported += 1
                if carried != write["old_generation"]:
                    report.stale_writes_applied += 1
                    report.violation(f"{job_id}: failure of generation {carried} applied to "
                                     f"generation {write['old_generation']}")
            elif (write["error_head"] or "").startswith(ATOMIC_WORKER_ERRORS + (TIMEOUT_ERROR,)):
                # Fenced like every final write, but its text names no generation: that it
                # belongs to this claim rests on the fence (the executions are checked below).
                # A timeout's failure is one too (counted with them).
                write["worker_failure"] = True
                report.atomic_failures_reported += 1
            elif (write["error_tail"] or "").startswith(LAPSE_ERROR):
                report.lease_lapses += 1
                if write["old_lease"] is None or write["old_lease"] > write["at"]:
                    report.violation(f"{job_id}: re-queued as lapsed at {write['at']} but its "
                                     f"lease ran to {write['old_lease']}")
            else:
                report.violation(f"{job_id}: processing -> queued by an unknown write "
                                 f"({write['error_tail']!r})")
        elif (old, new) == ("queued", "cancelled") and expected.get(job_id) == "cancelled":
            pass  # a failed dependency's trigger cancelled it (workflows.py checks why)
        elif old in ("done", "cancelled"):
            report.violation(f"{job_id}: a finished ({old}) row changed to {new}")
        else:
            report.violation(f"{job_id}: unexpected transition {old} -> {new}")
    for job_id, count in completions.items():
        if count > 1:
            report.double_completions += 1
            report.violation(f"{job_id}: {count} completions applied")
    for job_id, row in jobs.items():
        if row["status"] == "done" and completions[job_id] != 1:
            report.violation(f"{job_id} is done with {completions[job_id]} audited completions")

    # Final rows: the result is the one of the claim that holds the row.
    by_exec = {str(e["exec_id"]): e for e in executions}
    for job_id, row in jobs.items():
        if row["status"] != "done":
            continue
        result = row["result"] if isinstance(row["result"], dict) else {}
        if result.get("generation") != row["claim_generation"] or result.get("job") != str(job_id):
            report.stale_writes_applied += 1
            report.violation(f"{job_id}: result {result!r} is not generation "
                             f"{row['claim_generation']}'s")
            continue
        producer = by_exec.get(result.get("exec"))
        if producer is None or producer["job_id"] != job_id or (
                producer["attempt"] != row["claim_generation"]):
            report.violation(f"{job_id}: its result names no execution of generation "
                             f"{row['claim_generation']}")

    # 4. Executions ---------------------------------------------------------------
    report.executions = len(executions)
    per_job: dict = defaultdict(list)
    for execution in executions:
        per_job[execution["job_id"]].append(execution)
    run_claims = set()
    for job_id, runs in per_job.items():
        if job_id not in enqueued:
            report.violation(f"an execution of {job_id}, which was never enqueued")
        generations = Counter(e["attempt"] for e in runs)
        for generation, count in generations.items():
            if count > 1:
                report.violation(f"{job_id}: generation {generation} ran {count} times")
        for e in runs:
            key = (job_id, e["attempt"])
            run_claims.add(key)
            claim = claims.get(key)
            if claim is None:
                report.violation(f"{job_id}: execution of generation {e['attempt']} without "
                                 "such a claim")
            elif e["worker_id"] is not None and claim["new_owner"] != e["worker_id"]:
                report.violation(f"{job_id}: generation {e['attempt']} claimed by "
                                 f"{claim['new_owner']} but run by {e['worker_id']}")
            if (e["worker_id"] is not None and e["row_owner"] == e["worker_id"]
                    and e["row_status"] == "processing"):
                report.owned_row_reads += 1
                if e["row_generation"] != e["attempt"]:
                    report.violation(f"{job_id}: context generation {e['attempt']} but its own "
                                     f"row said {e['row_generation']}")
    report.claims_never_run = sum(1 for key in claims if key not in run_claims)

    # 5. Extra executions --------------------------------------------------------------
    for job_id, runs in per_job.items():
        runs = sorted(runs, key=lambda e: e["attempt"])
        report.duplicate_executions += len(runs) - 1
        for earlier, later in zip(runs, runs[1:]):
            if earlier["attempt"] < later["attempt"]:
                report.duplicates_earlier_generation_lower += 1
            end = claim_end.get((job_id, earlier["attempt"]))
            if end is None or end["new_status"] != "queued":
                report.unexplained_duplicates += 1
                report.violation(f"{job_id}: generation {later['attempt']} ran although "
                                 f"generation {earlier['attempt']} never ended by a lapse or "
                                 "a reported failure")
                continue
            if later["started_at"] <= end["at"]:
                report.unexplained_duplicates += 1
                report.violation(f"{job_id}: generation {later['attempt']} started before "
                                 f"generation {earlier['attempt']} ended")
                continue
            if end["error_generation"] is not None or end.get("worker_failure"):
                report.reruns_after_failure += 1
            else:
                report.reruns_after_lapse += 1
                if earlier["finished_at"] is not None:
                    report.stale_results_refused += 1

    # 6. Workers recover after every restart ------------------------------------------
    for restart in restarts or []:
        up = dt.datetime.fromtimestamp(restart["up"], dt.timezone.utc)
        later_runs = [e for e in executions if e["started_at"] > up]
        if len(later_runs) < 50:  # too little work left to expect every worker to get some
            continue
        for worker_id, (start, end) in (survivors or {}).items():
            if start < restart["down"] and end > restart["up"] + 10:
                if not any(e["worker_id"] == worker_id for e in later_runs):
                    report.workers_not_recovered += 1
                    report.violation(f"worker {worker_id} ran nothing after the "
                                     f"{restart['mode']} restart at {up:%H:%M:%S}")

    # 7. Stopped workers' late completions ----------------------------------------------
    stopped_keys = set()
    for claim in stopped or []:
        key = (_uuid(claim["job_id"]), claim["generation"])
        stopped_keys.add(key)
        report.stopped_claims += 1
        end = claim_end.get(key)
        if end is not None and end.get("new_status") == "done":
            report.stopped_completions_applied += 1
            report.violation(f"{key[0]}: the completion of generation {key[1]}, held by a "
                             "worker while it was stopped past its lease, was applied")

    # 8-9. Effects ---------------------------------------------------------------------
    if effects:
        _check_effects(conn, report, enqueued, jobs, claim_end, executions, stopped_keys)
    return report


def _uuid(value):
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def _check_effects(conn, report: Report, enqueued: set, jobs: dict, claim_end: dict,
                   executions: list[dict], stopped_keys: set) -> None:
    report.effects_checked = True
    rows = _rows(conn, "SELECT job_id, generation, exec_id FROM chaos_effects ORDER BY id")
    report.effects_rows = len(rows)
    per_job: dict = defaultdict(list)
    for row in rows:
        per_job[row["job_id"]].append(row)
    for job_id in per_job:
        if job_id not in enqueued:
            report.violation(f"an effect row of {job_id}, which was never enqueued")
    for job_id in enqueued:
        effect_rows = per_job.get(job_id, [])
        report.effects_per_job[len(effect_rows)] += 1
        row = jobs.get(job_id)
        landed = None  # the generation whose completion landed
        if row is not None and row["status"] == "done":
            end = claim_end.get((job_id, row["claim_generation"]))
            if end is not None and end["new_status"] == "done":
                landed = row["claim_generation"]
        result = row["result"] if row is not None and isinstance(row["result"], dict) else {}
        for effect in effect_rows:
            key = (job_id, effect["generation"])
            if effect["generation"] != landed:
                report.effects_not_landed += 1
                if key in stopped_keys:
                    report.effects_of_stopped += 1
                    report.violation(f"{job_id}: an effect row of generation "
                                     f"{effect['generation']}, a claim held by a stopped "
                                     "worker, whose completion was refused")
                else:
                    report.violation(f"{job_id}: an effect row of generation "
                                     f"{effect['generation']}, whose completion did not "
                                     f"land (landed: {landed})")
            elif str(effect["exec_id"]) != result.get("exec"):
                report.violation(f"{job_id}: its effect row names execution "
                                 f"{effect['exec_id']}, its result {result.get('exec')}")
        if len(effect_rows) != (0 if landed is None else 1):
            report.effects_not_once += 1
            report.violation(f"{job_id}: {len(effect_rows)} effect rows, not "
                             f"{0 if landed is None else 1}")
    kept = {(row["job_id"], row["generation"]) for row in rows}
    report.effects_rolled_back = sum(
        1 for e in executions
        if e.get("effect_at") is not None and (e["job_id"], e["attempt"]) not in kept)

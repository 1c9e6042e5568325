"""The workflows scenario of the chaos run (issue 29 item 5): batches and a random DAG.

``plan()`` draws the work: ``batches`` batches of ``batch_size`` ``chaos.work``
members, each with an ``on_complete`` callback (``chaos.work`` with
``callback=True``: it reads ``current_job().batch()`` and returns how many
members it saw unfinished), and ``dag_jobs`` further ``chaos.work`` jobs with
``depends_on``: chains (a job on the one drawn before it), fan-in (two to
four jobs of anything drawn earlier, callbacks included) and roots. A few
members and DAG jobs fail on every attempt (``fail_always``, enqueued with
``max_attempts=1``): they end dead-lettered and cancel their dependents, down
the graph; the rest may fail their first attempt (``fail_first``), which is
not an ending. From the plan, each job's expected ending follows: a job with
a dependency not expected ``done`` is ``cancelled``; else ``dead_letter`` if
it fails always; else ``done`` (a callback waits for any outcome: ``done``).

``prepare()`` (in the worker's Django, tests/chaos/prepare.py) enqueues the
plan through the public API -- ``batch(..., on_complete=...)`` and
``bulk_enqueue`` with ``depends_on`` -- with each job's id, kind, batch,
dependencies and expected ending in ``chaos_workflow``, in the same
transactions as the jobs.

``check_workflows()`` proves, beyond what ``checker.check`` proves of every
job (given the expected endings: nothing lost, one completion per done job,
no stale write, re-runs only after a lapse or a reported failure):

1. **Every job ended as expected**: done, dead-lettered (its own failure) or
   cancelled -- and a cancelled job's ``last_error`` is
   ``dependency_failed:<id>`` naming one of its own dependencies that did not
   end done. A cancelled job never ran.
2. **No dependent early**: every execution of a job with dependencies started
   after each dependency's applied completion (the audited processing→done
   write, timestamped inside its transaction), and its first claim too.
3. **Every callback exactly once, after every member finished**: one applied
   completion; its first claim and every execution after the last member's
   ending (its completion or its move to the dead letters); its landed result
   saw all ``batch_size`` members, none unfinished.
4. **No counter left**: no ``soniq_job_waits`` row and no ``waiting``
   dependency edge remain.
"""

import datetime as dt
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass

WORKFLOW_SCHEMA_SQL = """
CREATE TABLE chaos_workflow (
    job_id uuid PRIMARY KEY,
    kind text NOT NULL,            -- member, callback or dag
    batch integer,                 -- members and callbacks: their batch's number
    deps uuid[] NOT NULL,          -- the depends_on it was enqueued with (a callback: none)
    expect text NOT NULL           -- done, dead_letter or cancelled
);
"""


@dataclass
class Plan:
    nodes: list[dict]

    @property
    def jobs(self) -> int:
        return len(self.nodes)


def plan(rng, *, batches: int, batch_size: int, dag_jobs: int, job_seconds: tuple,
         fail_fraction: float, flaky_fraction: float, long_fraction: float = 0.0,
         long_seconds: tuple = (1.5, 3.5)) -> Plan:
    """Draw the scenario's jobs, in an order where every dependency comes first."""
    nodes: list[dict] = []

    def node(kind: str, **extra) -> dict:
        long = kind != "callback" and rng.random() < long_fraction
        args = {"n": len(nodes),
                "seconds": round(rng.uniform(*(long_seconds if long else job_seconds)), 3)}
        if kind != "callback" and rng.random() < fail_fraction:
            args["fail_always"] = True
        elif rng.random() < flaky_fraction:
            args["fail_first"] = True
        if kind == "callback":
            args["callback"] = True
        item = {"id": str(uuid.UUID(int=rng.getrandbits(128), version=4)), "kind": kind,
                "args": args, "deps": [], "batch": None, **extra}
        nodes.append(item)
        return item

    callbacks = []
    for number in range(batches):
        members = [node("member", batch=number) for _ in range(batch_size)]
        callback = node("callback", batch=number)
        callback["members"] = [m["id"] for m in members]
        callbacks.append(callback)
    earlier = [n["id"] for n in nodes]
    previous = None
    for _ in range(dag_jobs):
        shape = rng.random()
        if previous is not None and shape < 0.4:                  # a chain link
            deps = [previous]
        elif earlier and shape < 0.8:                             # fan-in
            deps = rng.sample(earlier, min(len(earlier), rng.randint(2, 4)))
        elif callbacks and shape < 0.9:                           # after a batch's callback
            deps = [rng.choice(callbacks)["id"]]
        else:                                                     # a root
            deps = []
        item = node("dag", deps=deps)
        earlier.append(item["id"])
        previous = item["id"]

    expected: dict[str, str] = {}
    for item in nodes:
        if item["kind"] == "callback":
            item["expect"] = "done"
        elif any(expected[d] != "done" for d in item["deps"]):
            item["expect"] = "cancelled"
        elif item["args"].get("fail_always"):
            item["expect"] = "dead_letter"
        else:
            item["expect"] = "done"
        expected[item["id"]] = item["expect"]
    return Plan(nodes)


def prepare(nodes: list[dict]) -> int:
    """Enqueue the plan (Django set up, migrated, chaos tables made); return the jobs' count."""
    from django.db import connection, transaction

    from soniq_django import batch, bulk_enqueue
    from soniq_django.producer.request import JobRequest

    with connection.cursor() as cursor:
        cursor.execute(WORKFLOW_SCHEMA_SQL)

    def request(item: dict) -> JobRequest:
        attempts = 1 if item["args"].get("fail_always") else 50
        return JobRequest("chaos.work", item["args"], max_attempts=attempts, job_id=item["id"],
                          depends_on=item["deps"] or None)

    def record(items: list[dict]) -> None:
        with connection.cursor() as cursor:
            cursor.executemany("INSERT INTO chaos_enqueued (job_id) VALUES (%s)",
                               [(item["id"],) for item in items])
            cursor.executemany(
                "INSERT INTO chaos_workflow (job_id, kind, batch, deps, expect) "
                "VALUES (%s, %s, %s, %s::uuid[], %s)",
                [(item["id"], item["kind"], item["batch"], item["deps"], item["expect"])
                 for item in items])

    by_batch: dict[int, list[dict]] = defaultdict(list)
    dag = []
    for item in nodes:
        if item["kind"] == "dag":
            dag.append(item)
        else:
            by_batch[item["batch"]].append(item)
    for number, items in sorted(by_batch.items()):
        members = [item for item in items if item["kind"] == "member"]
        (callback,) = [item for item in items if item["kind"] == "callback"]
        with transaction.atomic():
            info = batch([request(item) for item in members], on_complete=JobRequest(
                "chaos.work", callback["args"], max_attempts=50, job_id=callback["id"]))
            assert [str(i) for i in info.job_ids] == [m["id"] for m in members]
            assert str(info.callback_id) == callback["id"]
            record(items)
    for start in range(0, len(dag), 1000):
        chunk = dag[start:start + 1000]
        with transaction.atomic():
            bulk_enqueue([request(item) for item in chunk])
            record(chunk)
    return len(nodes)


def _rows(conn, sql: str, params=None) -> list[dict]:
    cursor = conn.execute(sql, params)
    names = [column.name for column in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


def expected_endings(conn) -> dict:
    return {row["job_id"]: row["expect"]
            for row in _rows(conn, "SELECT job_id, expect FROM chaos_workflow")}


@dataclass
class WorkflowReport:
    batches: int = 0
    members: int = 0
    dag_jobs: int = 0
    with_dependencies: int = 0
    edges: int = 0
    expected: Counter = None           # ending -> jobs planned to end so
    ended: Counter = None              # ending -> jobs that did
    not_as_expected: int = 0
    callbacks_completed_once: int = 0
    callback_executions: int = 0
    callbacks_early: int = 0
    callback_gap_min: float | None = None   # s from the last member's ending to the first claim
    dependents_early: int = 0
    dependency_gap_min: float | None = None  # s from the last dependency's completion to a start
    cancelled_ok: int = 0
    cancelled_bad: int = 0
    cancelled_ran: int = 0
    counters_left: int = 0


def check_workflows(conn, report) -> WorkflowReport:
    """Add the workflow scenario's proofs to ``report`` (a checker.Report)."""
    w = WorkflowReport(expected=Counter(), ended=Counter())
    plan_rows = {row["job_id"]: row for row in _rows(conn, "SELECT * FROM chaos_workflow")}
    status = {row["id"]: row for row in _rows(
        conn, "SELECT j.id, j.status, j.last_error, j.result FROM soniq_jobs AS j "
              "JOIN chaos_workflow AS c ON c.job_id = j.id")}
    for row in _rows(conn, "SELECT d.id FROM soniq_dead_letter_jobs AS d "
                           "JOIN chaos_workflow AS c ON c.job_id = d.id"):
        status[row["id"]] = {"id": row["id"], "status": "dead_letter", "last_error": None,
                             "result": None}
    writes = _rows(conn, "SELECT w.* FROM chaos_writes AS w "
                         "JOIN chaos_workflow AS c ON c.job_id = w.job_id ORDER BY w.id")
    executions = _rows(conn, "SELECT e.* FROM chaos_executions AS e "
                             "JOIN chaos_workflow AS c ON c.job_id = e.job_id")
    completed: dict = {}                       # job -> when its completion was applied
    ended: dict = {}                           # job -> when it ended (done or dead-lettered)
    first_claim: dict = {}
    completions = Counter()
    for write in writes:
        job_id = write["job_id"]
        if write["op"] == "update" and (write["old_status"], write["new_status"]) == (
                "processing", "done"):
            completions[job_id] += 1
            completed.setdefault(job_id, write["at"])
            ended.setdefault(job_id, write["at"])
        elif write["op"] == "delete" and write["old_status"] == "processing":
            ended.setdefault(job_id, write["at"])
        elif write["op"] == "update" and (write["old_status"], write["new_status"]) == (
                "queued", "processing"):
            first_claim.setdefault(job_id, write["at"])
    starts: dict = defaultdict(list)
    for execution in executions:
        starts[execution["job_id"]].append(execution["started_at"])

    def gap(later: dt.datetime, earlier: dt.datetime) -> float:
        return (later - earlier).total_seconds()

    # 1. Endings ---------------------------------------------------------------------
    for job_id, row in plan_rows.items():
        w.expected[row["expect"]] += 1
        w.members += row["kind"] == "member"
        w.batches += row["kind"] == "callback"
        w.dag_jobs += row["kind"] == "dag"
        w.with_dependencies += bool(row["deps"])
        w.edges += len(row["deps"])
        final = status.get(job_id)
        ending = final["status"] if final else "missing"
        w.ended[ending] += 1
        if ending != row["expect"]:
            w.not_as_expected += 1
            report.violation(f"{job_id} ({row['kind']}) ended {ending}, expected {row['expect']}")
        if ending == "cancelled":
            named = (final["last_error"] or "").removeprefix("dependency_failed:")
            try:
                named_id = uuid.UUID(named)
            except ValueError:
                named_id = None
            if (not (final["last_error"] or "").startswith("dependency_failed:")
                    or named_id not in row["deps"]
                    or status.get(named_id, {}).get("status") == "done"):
                w.cancelled_bad += 1
                report.violation(f"{job_id}: cancelled with {final['last_error']!r}, not "
                                 "dependency_failed:<a dependency that failed>")
            else:
                w.cancelled_ok += 1
            if starts.get(job_id) or job_id in first_claim:
                w.cancelled_ran += 1
                report.violation(f"{job_id}: cancelled by a failed dependency, yet it ran")

    # 2. No dependent early ------------------------------------------------------------
    for job_id, row in plan_rows.items():
        if not row["deps"]:
            continue
        times = starts.get(job_id, []) + ([first_claim[job_id]] if job_id in first_claim else [])
        if not times:
            continue
        missing = [d for d in row["deps"] if d not in completed]
        if missing:
            w.dependents_early += 1
            report.violation(f"{job_id} ran although its dependency {missing[0]} never "
                             "completed")
            continue
        last = max(completed[d] for d in row["deps"])
        first = min(times)
        margin = gap(first, last)
        w.dependency_gap_min = margin if w.dependency_gap_min is None else min(
            w.dependency_gap_min, margin)
        if first <= last:
            w.dependents_early += 1
            report.violation(f"{job_id} started at {first} before its last dependency "
                             f"completed at {last}")

    # 3. Callbacks --------------------------------------------------------------------------
    members_of: dict = defaultdict(list)
    for job_id, row in plan_rows.items():
        if row["kind"] == "member":
            members_of[row["batch"]].append(job_id)
    for job_id, row in plan_rows.items():
        if row["kind"] != "callback":
            continue
        w.callback_executions += len(starts.get(job_id, []))
        if completions[job_id] == 1 and status.get(job_id, {}).get("status") == "done":
            w.callbacks_completed_once += 1
        else:
            report.violation(f"callback {job_id}: {completions[job_id]} completions applied, "
                             f"status {status.get(job_id, {}).get('status')}")
        members = members_of[row["batch"]]
        unended = [m for m in members if m not in ended]
        if unended:
            report.violation(f"callback {job_id}: member {unended[0]} never ended")
            continue
        last = max(ended[m] for m in members)
        times = starts.get(job_id, []) + ([first_claim[job_id]] if job_id in first_claim else [])
        if not times:
            continue
        margin = gap(min(times), last)
        w.callback_gap_min = margin if w.callback_gap_min is None else min(
            w.callback_gap_min, margin)
        if min(times) <= last:
            w.callbacks_early += 1
            report.violation(f"callback {job_id} started at {min(times)} before its last "
                             f"member ended at {last}")
        result = (status.get(job_id) or {}).get("result")
        result = result if isinstance(result, dict) else {}
        if result.get("members") != len(members) or result.get("members_unfinished") != 0:
            report.violation(f"callback {job_id}: its landed run saw {result.get('members')} "
                             f"members, {result.get('members_unfinished')} unfinished")

    # 4. No counter left ----------------------------------------------------------------------
    w.counters_left = (conn.execute("SELECT count(*) FROM soniq_job_waits").fetchone()[0]
                       + conn.execute("SELECT count(*) FROM soniq_job_dependencies "
                                      "WHERE state = 'waiting'").fetchone()[0])
    if w.counters_left:
        report.violation(f"{w.counters_left} waits rows or waiting edges left after the drain")
    return w


def summary_lines(w: WorkflowReport) -> list[str]:
    def fmt(counter: Counter) -> str:
        return ", ".join(f"{counter[k]} {k}" for k in ("done", "dead_letter", "cancelled")) + (
            f", {counter['missing']} missing" if counter.get("missing") else "")

    def ms(value: float | None) -> str:
        return "n/a" if value is None else f"{value * 1000:.1f} ms"

    return [
        f"  workflows:               {w.batches} batches of {w.members // max(w.batches, 1)} "
        f"members + callback; {w.dag_jobs} DAG jobs, {w.with_dependencies} with dependencies "
        f"({w.edges} edges)",
        f"  endings:                 expected {fmt(w.expected)}; ended {fmt(w.ended)}; "
        f"not as expected {w.not_as_expected}",
        f"  callbacks:               {w.callbacks_completed_once} of {w.batches} completed "
        f"exactly once ({w.callback_executions} executions); started before their last "
        f"member ended: {w.callbacks_early}; least margin {ms(w.callback_gap_min)}",
        f"  dependents early:        {w.dependents_early}; least margin from the last "
        f"dependency's completion to a claim or start {ms(w.dependency_gap_min)}",
        f"  cancelled:               {w.cancelled_ok} with dependency_failed:<a failed "
        f"dependency>, {w.cancelled_bad} otherwise, {w.cancelled_ran} that ran",
        f"  counters left:           {w.counters_left}",
    ]

"""What a dependency and a batch cost per job (issue 29), against plain jobs, in one run.

Four workloads of ``N`` (``--drain-jobs``) ``bench.noop`` jobs each, enqueued through
the public API in transactions of 100 jobs (``bench/soniq_tasks.py``, actions
``wf_*``), then drained in full by one ``soniq_worker`` process at concurrency
``WF_CONCURRENCY``; the four are measured back to back, their order rotating with
the repetition:

- ``plain``: ``bulk_enqueue`` of 100 jobs per transaction;
- ``after_done``: the same, each job with ``depends_on=[D]``, D a job already done
  (what ``depends_on`` costs when there is nothing to wait for: the dependency's
  lock and check at enqueue, a job that is claimable at once);
- ``pairs``: N/2 pairs in ``bulk_enqueue`` calls of 50 pairs, the second job of
  each with ``depends_on=[the first]``: half the jobs wait (a dependency row, a
  waits row, scheduled at 9999-01-01), the other half release one each when they
  complete, in their completion's transaction;
- ``batch``: ``batch()`` of 100 members with an ``on_complete`` callback, N/100
  times (N + N/100 jobs run): every member's completion counts the callback's
  waits row down; the last one releases it.

Each row is the drain's rate (handler starts per second, first to last) and
the enqueue's (jobs per second of the enqueue calls); the ratio is to the plain
jobs of the same repetition. The verdict: a dependency or a batch membership
costs at most half of a plain job's throughput (≥0.5× plain), a bound set
before measuring. The wall-clock difference per job (µs, at that concurrency)
is printed beside it.
"""

import tempfile
from pathlib import Path

from bench.common import connect, quiesce, read_stamps

KINDS = ("plain", "after_done", "pairs", "batch")
LABELS = {"plain": "plain jobs",
          "after_done": "depends_on=[a done job]",
          "pairs": "pairs: 1 of 2 waits for the other",
          "batch": "batches of 100 + on_complete"}
WF_CONCURRENCY = 8
GOAL = 0.5
RESET_SQL = ("TRUNCATE soniq_jobs, soniq_dead_letter_jobs, soniq_workers, soniq_throughput, "
             "soniq_queue_settings, soniq_queue_starts, soniq_job_dependencies, soniq_job_waits, "
             "soniq_batches, soniq_batch_members")


def _drain(soniq, cfg, run_workers, runs: int, done: int) -> float:
    """Drain everything queued (waiting jobs included) with one worker until ``done`` rows
    are done; its start rate over the ``runs`` handler runs."""
    stamps_dir = Path(tempfile.mkdtemp(prefix="stamps-", dir=soniq.log_dir))

    def until(procs) -> bool:
        if any(child.poll() is not None for child in procs):
            raise RuntimeError("soniq worker exited during a workflows drain")
        return soniq.sql("SELECT count(*) FROM soniq_jobs WHERE status = 'done'") >= done

    run_workers(soniq, WF_CONCURRENCY, 1, "continuous", stamps_dir, until=until,
                timeout=cfg.drain_timeout)
    stamps = sorted(read_stamps(str(stamps_dir)))
    left = soniq.sql("SELECT count(*) FROM soniq_jobs WHERE status <> 'done'")
    if len(stamps) != runs or left:
        raise RuntimeError(f"workflows drain: {len(stamps)} handler runs for {runs} jobs, "
                           f"{left} not done")
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def measure(cfg, soniq, res, run_workers, rep: int) -> None:
    n = cfg.drain_jobs - cfg.drain_jobs % 100
    kinds = KINDS[rep % len(KINDS):] + KINDS[:rep % len(KINDS)]
    for kind in kinds:
        with connect(soniq.db) as conn:
            conn.execute(RESET_SQL)
        found = soniq.action(f"wf_{kind}", n)
        quiesce(soniq.db)
        res.add(f"soniq.wf_enqueue_{kind}", found["rate"])
        res.add(f"soniq.wf_drain_{kind}", _drain(soniq, cfg, run_workers, found["jobs"],
                                                  found["jobs"] + found["done_before"]))


def render(cfg, res, lines: list, row, ratio, verdict) -> None:
    if "soniq.wf_drain_plain" not in res.values:
        return
    lines.append(f"WORKFLOWS (issue 29): {cfg.drain_jobs - cfg.drain_jobs % 100:,} bench.noop "
                 f"jobs, enqueued 100 per transaction, drained by 1 proc × conc "
                 f"{WF_CONCURRENCY}")
    plain = res.median("soniq.wf_drain_plain")
    for kind in KINDS:
        key = f"soniq.wf_enqueue_{kind}"
        text = "" if kind == "plain" else ratio(key, "soniq.wf_enqueue_plain", "plain")[1]
        row(f"enqueue, {LABELS[kind]}", key, ratio=text)
    for kind in KINDS:
        key = f"soniq.wf_drain_{kind}"
        if kind == "plain":
            row(f"drain, {LABELS[kind]}", key)
            continue
        value, text = ratio(key, "soniq.wf_drain_plain", "plain")
        mine = res.median(key)
        extra = ""
        if plain and mine:
            extra = f" ({(1 / mine - 1 / plain) * 1e6:+.0f} µs/job)"
        row(f"drain, {LABELS[kind]}", key, ratio=text + extra,
            target=f"≥{GOAL}× plain: {verdict(value, GOAL)}")

"""The drain race (issue 17, part 4): one soniq_worker process at its best concurrency.

Measured in the same run, each against the others:

- soniq_worker --burst, 1 process, at each of RACE_CONCURRENCY (beyond the table's 1, 4, 8);
- pgqueuer's worker at the same batch sizes (its best configuration is one of them);
- the batched raw-SQL ceiling (bench/raw.py ``raw_batch_drain``): K connections, each
  completing its last 10 jobs and claiming the next 10 in one statement, one commit;
- the worker's CPU per job: user + system time of the worker process over a full drain
  at its best concurrency, minus the same worker's start-up and exit on an empty queue.

The verdict rows compare medians of the best configurations (the ratio of two maxima,
each taken over its own configurations), so they are only as good as a quiet machine.
"""

import resource
import shutil
import tempfile
from pathlib import Path

from bench import raw
from bench.common import quiesce

#: Concurrencies (pgqueuer: batch sizes) the race adds to the table's own.
RACE_CONCURRENCY = (16, 32, 64)
#: Connections of the batched ceiling.
BATCH_CONNECTIONS = (1, 2, 4, 8)
#: Goals: best 1-proc drain ÷ pgqueuer's best (issue 27: at least par; issue 17: twice),
#: ÷ the batched ceiling; worker ms of CPU per job.
PAR_PGQUEUER = 1.0
TWICE_PGQUEUER = 2.0
HALF_BATCHED = 0.5
CPU_MS_PER_JOB = 0.08
#: bench/soniq_app/jobs.py's no-op as an ``async def`` handler (it runs on the worker's loop).
ASYNC_NOOP = "bench.anoop"


def race_concurrency(cfg) -> tuple[int, ...]:
    """Every concurrency the race compares: the table's own and RACE_CONCURRENCY."""
    return tuple(sorted(set(cfg.concurrency) | set(cfg.race_concurrency)))


def worker_cpu(system, cfg, concurrency: int, jobs: int, run_workers,
               job_name: str | None = None) -> float:
    """CPU seconds (user + system) of one worker process draining ``jobs`` jobs to the end."""
    system.reset()
    if jobs:
        system.preload(jobs, *([job_name] if job_name else []))
    quiesce(system.db)
    stamps_dir = Path(tempfile.mkdtemp(prefix="stamps-", dir=system.log_dir))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        run_workers(system, concurrency, 1, "drain", stamps_dir,
                    until=lambda procs: all(child.poll() is not None for child in procs),
                    timeout=cfg.drain_timeout)
    finally:
        shutil.rmtree(stamps_dir, ignore_errors=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if jobs:
        finished = system.sql(system.done_sql)
        if finished != jobs:
            raise RuntimeError(f"{system.name}: drained {finished} of {jobs} jobs")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def cpu_per_job_ms(system, cfg, concurrency: int, run_workers, job_name: str | None = None
                   ) -> float:
    """ms of worker CPU per job: a full drain's, start-up and exit (an empty drain's) taken off."""
    idle = worker_cpu(system, cfg, concurrency, 0, run_workers)
    busy = worker_cpu(system, cfg, concurrency, cfg.cpu_jobs, run_workers, job_name)
    return max(0.0, busy - idle) / cfg.cpu_jobs * 1000


def best(res, prefix: str, concurrencies) -> tuple[int, float] | None:
    """The configuration with the highest median rate: (concurrency, rate)."""
    found = [(conc, res.median(f"{prefix}{conc}")) for conc in concurrencies]
    found = [(conc, value) for conc, value in found if value is not None]
    return max(found, key=lambda pair: pair[1]) if found else None


def measure(cfg, systems, raw_db: str, res, fresh_raw, drain, run_workers) -> None:
    """One repetition of the race's own rows (the table measured 1, 4 and 8 already)."""
    soniq = systems["soniq"]
    pgqueuer = systems.get("pgqueuer")
    for conns in BATCH_CONNECTIONS:
        fresh_raw(cfg.drain_jobs)
        res.add(f"raw.batch.{conns}", raw.raw_batch_drain(raw_db, conns, cfg.window)["rate"])
    # The full run measured 1, 4 and 8 already; --only drain measures every one here.
    for conc in race_concurrency(cfg) if cfg.only == "drain" else cfg.race_concurrency:
        res.add(f"soniq.drain.1x{conc}", drain(soniq, cfg, conc, 1)["rate"])
        if pgqueuer is not None:
            res.add(f"pgqueuer.drain.1x{conc}", drain(pgqueuer, cfg, conc, 1)["rate"])
    for conc in race_concurrency(cfg):  # the no-op as an async def handler, as pgqueuer's is
        res.add(f"soniq.adrain.1x{conc}",
                drain(soniq, cfg, conc, 1, job_name=ASYNC_NOOP)["rate"])
    for kind, job_name in (("drain", None), ("adrain", ASYNC_NOOP)):
        mine = best(res, f"soniq.{kind}.1x", race_concurrency(cfg))
        if mine is not None:
            key = f"soniq.{kind}_cpu_ms"
            res.add(key, cpu_per_job_ms(soniq, cfg, mine[0], run_workers, job_name))
            res.notes[key] = f"conc {mine[0]}"
    theirs = best(res, "pgqueuer.drain.1x", race_concurrency(cfg))
    if pgqueuer is not None and theirs is not None:
        res.add("pgqueuer.cpu_ms", cpu_per_job_ms(pgqueuer, cfg, theirs[0], run_workers))
        res.notes["pgqueuer.cpu_ms"] = f"batch {theirs[0]}"


def render(cfg, res, lines: list[str], row, verdict) -> None:
    """The race's section of the table: its rows, then the three verdicts."""
    if not any(key.startswith("raw.batch.") for key in res.values):
        return
    lines.append("DRAIN RACE (one worker process at its best; docs/performance.md#the-drain-race)")
    for conns in BATCH_CONNECTIONS:
        row(f"raw batched: complete 10 + claim 10 /txn, {conns} conn", f"raw.batch.{conns}")
    for conc in race_concurrency(cfg):
        if conc not in cfg.concurrency:  # 1, 4 and 8 are the table's own rows
            row(f"soniq_worker --burst, 1 proc × conc {conc}", f"soniq.drain.1x{conc}")
    for conc in race_concurrency(cfg):
        if conc not in cfg.concurrency or cfg.only == "drain":
            row(f"pgqueuer: drain, batch {conc}", f"pgqueuer.drain.1x{conc}")
    for conc in race_concurrency(cfg):
        row(f"soniq_worker, async def no-op, 1 proc × conc {conc}", f"soniq.adrain.1x{conc}")
    for kind, label in (("drain", "sync"), ("adrain", "async")):
        key = f"soniq.{kind}_cpu_ms"
        row(f"soniq worker CPU per job, {label} no-op, best conc", key, unit="ms", digits=3,
            ratio=res.notes.get(key, ""),
            target=f"≤{CPU_MS_PER_JOB} ms: "
                   f"{verdict(res.median(key), CPU_MS_PER_JOB, higher=False)}")
    row("pgqueuer worker CPU per job, best batch", "pgqueuer.cpu_ms", unit="ms", digits=3,
        ratio=res.notes.get("pgqueuer.cpu_ms", ""))
    theirs = best(res, "pgqueuer.drain.1x", race_concurrency(cfg))
    ceiling = best(res, "raw.batch.", BATCH_CONNECTIONS)
    width = 46
    for kind, label in (("drain", "sync"), ("adrain", "async")):
        mine = best(res, f"soniq.{kind}.1x", race_concurrency(cfg))
        if mine and theirs:
            value = mine[1] / theirs[1]
            lines.append(f"  {'best 1-proc drain (' + label + ') ÷ pgqueuer best':<{width}}"
                         f"{value:>10.2f}×  conc {mine[0]} vs batch {theirs[0]:<10} "
                         f"target ≥{PAR_PGQUEUER:g}×: {verdict(value, PAR_PGQUEUER)} "
                         f"(≥{TWICE_PGQUEUER:g}×: {verdict(value, TWICE_PGQUEUER)})")
        if mine and ceiling:
            value = mine[1] / ceiling[1]
            lines.append(f"  {'best 1-proc drain (' + label + ') ÷ batched ceiling':<{width}}"
                         f"{value:>10.2f}×  conc {mine[0]} vs {ceiling[0]} conn(s)      "
                         f"target ≥{HALF_BATCHED:g}×: {verdict(value, HALF_BATCHED)}")

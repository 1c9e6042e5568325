"""The limits-per-key scenario of the chaos run (issue 31 item 5).

300 ``chaos.keyed`` jobs over 10 keys at ``key_concurrency=1``, drained by 3
worker processes through SIGKILLs, a SIGSTOP past the lease, terminated
backends and a PostgreSQL restart; some jobs fail their first attempt
(retried) and some sleep past their ``@job(timeout=...)`` (failed at the
deadline while the handler runs on, holding its key's slot). Loaded only by
that run's processes (``SONIQ_IMPORTS``, set by the driver).

The handler (tests/chaos/keyed_jobs.py) records its execution before any work, as ``chaos.work`` does
(tests/chaos/jobs.py), and stamps ``finished_at`` when it returns, however it
returns. ``check_keys`` proves from those stamps, beyond what
``checker.check`` proves of every job:

1. **Never two runs of a key at once.** A run holds its key from its start
   until it returned, or until its claim lapsed and was reaped (a killed or
   stopped worker: the attempt history's ``lapsed`` attempt, ended by the
   reaper), or -- a handler running on past its timeout -- until its hold
   lapsed and was deleted (a stopped worker renews no hold:
   ``chaos_hold_ends``, tests/chaos/schema.py), whichever is first (docs/keys.md,
   "The guarantee"). Per key, no two such intervals overlap.
2. **Every job done**, and no key left counting: every ``soniq_key_slots``
   row at 0 with no offered job, no parked row, no key hold.
"""

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field

#: The keyed jobs' time limit (tests/chaos/keyed_jobs.py); a job asked to overrun sleeps past it.
KEY_TIMEOUT = 1.0


def specs(rng, *, jobs: int, keys: int, job_seconds: tuple, flaky_fraction: float,
          timeout_fraction: float) -> list[dict]:
    """The jobs' args: job n of key ``k{n % keys}``; a few flaky, a few overrunning."""
    drawn = []
    for n in range(jobs):
        spec = {"n": n, "seconds": round(rng.uniform(*job_seconds), 3), "key": f"k{n % keys}"}
        if rng.random() < flaky_fraction:
            spec["fail_first"] = True
        elif rng.random() < timeout_fraction:
            spec["overrun"] = True
        drawn.append(spec)
    return drawn


RUNS_SQL = """
SELECT e.job_id, e.attempt, e.started_at, e.finished_at,
       coalesce(j.concurrency_key, d.args ->> 'key'),
       CASE WHEN a.outcome = 'lapsed' THEN a.ended_at END, a.ended_at,
       (SELECT min(h.at) FROM chaos_hold_ends AS h
         WHERE h.job_id = e.job_id AND h.generation = e.attempt
           AND h.lease_expires_at <= h.at)
  FROM chaos_executions AS e
  LEFT JOIN soniq_jobs AS j ON j.id = e.job_id
  LEFT JOIN soniq_dead_letter_jobs AS d ON d.id = e.job_id
  LEFT JOIN soniq_job_attempts AS a ON a.job_id = e.job_id AND a.generation = e.attempt
"""


@dataclass
class KeyReport:
    keys: int = 0
    runs: int = 0
    runs_cut_by_lapse: int = 0
    runs_cut_by_hold_lapse: int = 0
    runs_killed_after_their_end: int = 0
    overlaps: int = 0
    closest_gap_ms: float | None = None
    overruns: int = 0
    leftovers: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


def _same(value):
    return value


def check_keys(conn, when=_same) -> KeyReport:
    """Check the keyed scenario from the database (see the module's docstring).

    ``conn``: a psycopg connection, or a ``sqlite3`` one (the SQLite run,
    tests/chaos/sqlite_keys.py), whose times come back as text: ``when`` makes
    each one (or None) a datetime."""
    report = KeyReport()
    by_key: dict[str, list[tuple]] = defaultdict(list)
    for (job_id, attempt, started, finished, key, lapsed, ended,
         hold_lapsed) in conn.execute(RUNS_SQL).fetchall():
        started, finished, lapsed, ended, hold_lapsed = (
            when(started), when(finished), when(lapsed), when(ended), when(hold_lapsed))
        if key is None:
            report.violations.append(f"{job_id}: an execution of a job with no key")
            continue
        end = finished
        if lapsed is not None and (end is None or lapsed < end):
            end = lapsed
            report.runs_cut_by_lapse += 1
        if hold_lapsed is not None and (end is None or hold_lapsed < end):
            end = hold_lapsed
            report.runs_cut_by_hold_lapse += 1
        if end is None and ended is not None:
            # Killed after its attempt ended (a timeout's failure, its handler running on):
            # its hold kept the slot until it lapsed; the attempt's end is a lower bound.
            end = ended
            report.runs_killed_after_their_end += 1
        if end is None:
            report.violations.append(f"{job_id}: generation {attempt} never ended")
            continue
        by_key[key].append((started, end, job_id, attempt))
        report.runs += 1
    report.keys = len(by_key)
    gap = dt.timedelta.max
    for key, runs in by_key.items():
        runs.sort()
        for (s1, e1, j1, g1), (s2, e2, j2, g2) in zip(runs, runs[1:]):
            if s2 < e1:
                report.overlaps += 1
                report.violations.append(
                    f"key {key}: {j2} generation {g2} started {(e1 - s2).total_seconds():.3f} s "
                    f"before {j1} generation {g1} ended")
            else:
                gap = min(gap, s2 - e1)
    if gap != dt.timedelta.max:
        report.closest_gap_ms = round(gap.total_seconds() * 1000, 3)
    report.overruns = conn.execute(
        "SELECT count(*) FROM soniq_job_attempts WHERE error LIKE 'timed out%%'").fetchone()[0]
    for what, sql in (
            ("a key still counting", "SELECT key FROM soniq_key_slots WHERE running <> 0"),
            ("a key still offering", "SELECT key FROM soniq_key_slots WHERE head IS NOT NULL"),
            ("a parked job", "SELECT key FROM soniq_key_parked"),
            ("a key hold", "SELECT key FROM soniq_key_holds")):
        for (key,) in conn.execute(sql).fetchall():
            report.leftovers.append(f"{what}: {key}")
    report.violations += report.leftovers
    return report


def summary_lines(report: KeyReport) -> list[str]:
    return [
        f"  keys:                    {report.keys} keys at key_concurrency=1, {report.runs} "
        f"runs ({report.runs_cut_by_lapse} ended by their claim's lapse, "
        f"{report.runs_cut_by_hold_lapse} running on past their timeout by their hold's "
        f"lapse, "
        f"{report.runs_killed_after_their_end} killed running on after a timeout), "
        f"{report.overruns} timed out and ran on holding their slot",
        f"  runs of a key at once:   overlaps {report.overlaps}; closest hand-over "
        f"{report.closest_gap_ms} ms; leftovers {len(report.leftovers)}",
    ]

"""WAL bytes per job (issue 27, part 3): what a job's life writes to the write-ahead log.

For soniq_django, pgqueuer and the raw-SQL ceiling, in the same run, each phase of a
job's life is measured on its own: the system's tables reset, ``VACUUM ANALYZE`` and a
``CHECKPOINT`` (so every phase starts as the others do, and the first change of each
page after it carries a full-page image), then the phase, with the WAL position read
before and after it:

- *enqueue, 1 job/txn*: soniq ``SELECT soniq_enqueue()`` (what ``enqueue()`` runs),
  pgqueuer ``Queries.enqueue()``, raw ``INSERT``;
- *bulk enqueue*: ``bulk_enqueue()`` (COPY from 500 jobs on), pgqueuer's list enqueue,
  raw ``COPY`` -- not part of the life below;
- *drain*: the jobs of the single-enqueue phase claimed and completed by one worker
  process at concurrency (pgqueuer: batch size) ``--wal-concurrency``; the raw ceiling
  claims and completes them with ``bench/raw.py``'s two statements per job on as many
  connections;
- *purge*: soniq ``purge_expired()`` of the finished rows (as the worker's housekeeping
  runs it once their result expired), raw ``DELETE`` in batches of 1,000; pgqueuer
  deletes a job at completion (in its drain) and has no purge, so its last phase is
  the log aggregation its worker runs every 30 s by default (``Queries.aggregate_logs()``:
  an ``UPDATE`` of every new ``pgqueuer_log`` row and an upsert of its statistics).

The whole life is enqueue + drain + purge (pgqueuer: + aggregation). Not counted, for
any system: vacuum (autovacuum is off for the bench; every system leaves dead tuples
for it) and pgqueuer's log rows' deletion (it never deletes them by default).

WAL is cluster-wide, and other sessions (other databases, autovacuum elsewhere, the
checkpointer) write some too. Each phase is therefore counted twice: the plain LSN
difference, and the bytes *attributed* to the system's database with ``pg_walinspect``
(PostgreSQL 15+): every record with a block of one of that database's own relations
(system catalogs left out: the pruning of the statistics that the ANALYZE before each
phase replaced is the benchmark's doing, not the job's), plus every record of a
transaction that has one (its commit). The attributed figure is the one the verdict
uses; on a quiet server the two agree to within the checkpointer's few records. With
``--wal-explain`` the records of each soniq phase are listed by relation and kind.
"""

import os
import re
import time
from collections import defaultdict

from bench import raw
from bench.common import connect, quiesce

#: Goal: soniq's WAL per job over the whole life ÷ pgqueuer's.
RATIO_GOAL = 0.6
PHASES = ("enqueue", "bulk", "drain", "purge")
LIFE = ("enqueue", "drain", "purge")
SYSTEMS = ("raw", "soniq", "pgqueuer")

#: What-if schemas for ``--wal-lever`` (decision 0051): each is DDL run on the soniq
#: database after its migrations, to measure what a lever not taken would save. None
#: of them is soniq_django's schema: a run with one says so in its header, and its soniq
#: rows measure a table that would break something (the decision says what).
LEVERS = {
    # The admin's index entered by finished rows only (the list would need the live rows
    # from elsewhere), or by every row version but the processing one, or not at all.
    "created-idx-finished": "DROP INDEX soniq_jobs_created_idx; CREATE INDEX "
                            "soniq_jobs_created_idx ON soniq_jobs (created_at) "
                            "WHERE status IN ('done', 'cancelled')",
    "created-idx-not-processing": "DROP INDEX soniq_jobs_created_idx; CREATE INDEX "
                                  "soniq_jobs_created_idx ON soniq_jobs (created_at) "
                                  "WHERE status <> 'processing'",
    "no-created-idx": "DROP INDEX soniq_jobs_created_idx",
    # Soniq's condition on the unique index: the raw INSERT that sql-api.md documented
    # until the lead's deprecation no longer infers it (42P10; decision 0036).
    "unique-queued-narrowed": "DROP INDEX soniq_jobs_unique_queued; CREATE UNIQUE INDEX "
                              "soniq_jobs_unique_queued ON soniq_jobs (job_name, args_hash) "
                              "WHERE status = 'queued' AND unique_job",
    # The claims of due scheduled jobs, limited queues' probes and the queue discovery
    # read it: only a new claim protocol version could do without it.
    "no-claim-idx": "DROP INDEX soniq_jobs_claim_idx",
    # Room on each page for the claim's and the completion's new versions (a storage
    # parameter, not part of the format: docs/storage-format.md; decision 0020).
    **{f"fillfactor-{n}": f"ALTER TABLE soniq_jobs SET (fillfactor = {n})"
       for n in (90, 80, 70, 50)},
}


def apply_levers(dbname: str, levers: list[str]) -> None:
    """Run each named lever's DDL on ``dbname`` (``--wal-lever``)."""
    with connect(dbname) as conn:
        for name in levers:
            conn.execute(LEVERS[name])


#: The records of one database: those with a block of one of its own relations
#: (relfilenode >= 16384, FirstNormalObjectId: not a system catalog, whose pages the
#: quiesce's ANALYZE leaves for the next reader to prune), and every record of a
#: transaction that wrote one (its commit).
_RECORDS = """
WITH r AS (SELECT start_lsn, end_lsn, xid::text AS xid, resource_manager, record_type,
                  fpi_length, block_ref,
                  EXISTS (SELECT 1 FROM regexp_matches(block_ref, %(pattern)s, 'g') AS m
                           WHERE m[1]::bigint >= 16384) AS own
             FROM pg_get_wal_records_info(%(begin)s::pg_lsn, %(end)s::pg_lsn)),
ours AS (SELECT DISTINCT xid FROM r WHERE xid <> '0' AND own)
SELECT {select}
  FROM r
 WHERE own OR xid IN (SELECT xid FROM ours)
 {group}
"""


class WalMeter:
    """WAL written between ``start()`` and ``stop()``: the LSN difference, and the bytes
    attributed to ``dbname`` (None when pg_walinspect cannot be installed)."""

    def __init__(self, dbname: str):
        self.dbname = dbname
        self.begin: str | None = None
        with connect(dbname) as conn:
            self.oid = conn.execute(
                "SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()[0]
            try:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
                self.inspect = True
            except Exception:  # not installed, or not superuser: the LSN difference only
                self.inspect = False
        self.pattern = rf"rel \d+/{self.oid}/(\d+)"
        # A temporary physical replication slot keeps the WAL from being recycled until
        # it is read: other sessions' checkpoints would otherwise remove it mid-phase.
        # It belongs to this connection and goes with it (close(), or the process's end).
        self.keeper = None
        if self.inspect:
            try:
                self.keeper = connect(dbname)
                self.keeper.execute("SELECT pg_create_physical_replication_slot(%s, true, true)",
                                    [f"soniq_bench_wal_{os.getpid()}"])
            except Exception:  # no free slot: read the WAL as soon as possible anyway
                self.close()

    def close(self) -> None:
        if self.keeper is not None:
            self.keeper.close()
            self.keeper = None

    @staticmethod
    def _lsn(conn) -> str:
        return conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]

    def start(self) -> None:
        with connect(self.dbname) as conn:
            self.begin = self._lsn(conn)

    def stop(self) -> dict:
        """{"lsn": bytes, "attributed": bytes | None, "fpi": bytes | None, "begin", "end"}."""
        with connect(self.dbname) as conn:
            end = self._lsn(conn)
            found = {"begin": self.begin, "end": end, "attributed": None, "fpi": None,
                     "lsn": conn.execute("SELECT %s::pg_lsn - %s::pg_lsn",
                                         [end, self.begin]).fetchone()[0]}
            if not self.inspect:
                return found
            self._wait_flushed(conn, end)
            try:
                row = conn.execute(
                    _RECORDS.format(select="coalesce(sum(end_lsn - start_lsn), 0), "
                                           "coalesce(sum(fpi_length), 0)", group=""),
                    {"begin": self.begin, "end": end, "pattern": self.pattern}).fetchone()
            except Exception as error:  # e.g. a checkpoint elsewhere recycled the segment
                print(f"bench: WAL of {self.dbname} not readable ({error}); "
                      "this phase counts in the LSN rows only", flush=True)
                found["unreadable"] = True
                return found
            found.update(attributed=int(row[0]), fpi=int(row[1]))
        return found

    @staticmethod
    def _wait_flushed(conn, end: str) -> None:
        """pg_walinspect reads only flushed WAL; asynchronous commits flush within ~0.2 s."""
        for _ in range(100):
            if conn.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn",
                            [end]).fetchone()[0]:
                return
            time.sleep(0.05)

    def explain(self, found: dict) -> list[tuple]:
        """The phase's attributed records by relation and kind:
        [(relation, rmgr, record type, with FPI, records, bytes, FPI bytes)], largest first."""
        with connect(self.dbname) as conn:
            names = dict(conn.execute(
                "SELECT pg_relation_filenode(oid)::text, relname FROM pg_class "
                "WHERE pg_relation_filenode(oid) IS NOT NULL").fetchall())
            rows = conn.execute(
                _RECORDS.format(select="resource_manager, record_type, block_ref, "
                                       "end_lsn - start_lsn AS size, fpi_length", group=""),
                {"begin": found["begin"], "end": found["end"], "pattern": self.pattern}
            ).fetchall()
        groups: dict[tuple, list] = defaultdict(lambda: [0, 0, 0])
        for rmgr, kind, blocks, size, fpi in rows:
            match = re.search(rf"rel \d+/{self.oid}/(\d+)", blocks or "")
            relation = names.get(match.group(1), match.group(1)) if match else "(no block)"
            entry = groups[(relation, rmgr, kind, bool(fpi))]
            entry[0] += 1
            entry[1] += int(size)
            entry[2] += int(fpi or 0)
        return sorted(((*key, *value) for key, value in groups.items()),
                      key=lambda item: -item[5])


def _measure(meter: WalMeter, body, count, explain: bool = False) -> dict:
    """Run ``body()`` between a checkpointed start and the stop; ``count()`` says how
    many jobs the phase handled. Returns the meter's figures and ``jobs`` (and, with
    ``explain``, the records by relation, read at once: the next phase's checkpoint
    may recycle the WAL)."""
    quiesce(meter.dbname)
    meter.start()
    body()
    found = meter.stop()
    found["jobs"] = count()
    if explain and meter.inspect:
        found["records"] = meter.explain(found)
    return found


def _count(system_db: str, sql: str) -> int:
    with connect(system_db) as conn:
        return conn.execute(sql).fetchone()[0]


def _raw_purge(dbname: str, batch: int = 1000) -> None:
    with connect(dbname) as conn:
        while conn.execute(
                "DELETE FROM raw_jobs WHERE id IN (SELECT id FROM raw_jobs "
                "WHERE status = 'done' LIMIT %s)", [batch]).rowcount == batch:
            pass


def _soniq_purge() -> None:
    """The worker's purge (soniq_django.housekeeping), as of a day ahead: every result expired."""
    import datetime as dt

    from django.db import connection
    from django.utils import timezone

    from soniq_django.housekeeping import purge_expired

    purge_expired(now=timezone.now() + dt.timedelta(days=1))
    connection.close()


def _drain_to_end(system, cfg, concurrency: int, run_workers) -> None:
    """One worker process at ``concurrency`` drains the queue; every job must finish."""
    import shutil
    import tempfile
    from pathlib import Path

    stamps = Path(tempfile.mkdtemp(prefix="stamps-", dir=system.log_dir))
    try:
        run_workers(system, concurrency, 1, "drain", stamps,
                    until=lambda procs: all(child.poll() is not None for child in procs),
                    timeout=cfg.drain_timeout)
    finally:
        shutil.rmtree(stamps, ignore_errors=True)
    queued = system.sql(system.queued_sql)
    if queued:
        raise RuntimeError(f"{system.name}: {queued} jobs left after the WAL drain")


def measure_system(name: str, cfg, systems, raw_db: str, run_workers) -> dict[str, dict]:
    """Every phase of one system: {phase: meter figures with jobs}."""
    meter = WalMeter(raw_db if name == "raw" else systems[name].db)
    try:
        return _phases(name, meter, cfg, systems, raw_db, run_workers)
    finally:
        meter.close()


def _phases(name: str, meter: WalMeter, cfg, systems, raw_db: str, run_workers
            ) -> dict[str, dict]:
    jobs, conc = cfg.wal_jobs, cfg.wal_concurrency
    found: dict[str, dict] = {}
    if name == "raw":
        table = "SELECT count(*) FROM raw_jobs"
        raw.reset_raw(raw_db)
        found["bulk"] = _measure(meter, lambda: raw.copy_rows(raw_db, jobs),
                                 lambda: _count(raw_db, table))
        raw.reset_raw(raw_db)
        found["enqueue"] = _measure(meter, lambda: raw.insert_loop(raw_db, jobs),
                                    lambda: _count(raw_db, table))
        found["drain"] = _measure(meter, lambda: raw.raw_drain(raw_db, conc, None),
                                  lambda: _count(raw_db, table + " WHERE status = 'done'"))
        done = found["drain"]["jobs"]
        found["purge"] = _measure(meter, lambda: _raw_purge(raw_db), lambda: done)
        return found
    system = systems[name]
    explain = cfg.wal_explain and name == "soniq"
    all_jobs = "SELECT count(*) FROM " + ("soniq_jobs" if name == "soniq" else "pgqueuer")
    system.reset()
    found["bulk"] = _measure(meter, lambda: system.action("bulk", jobs),
                             lambda: _count(system.db, all_jobs), explain)
    system.reset()
    if name == "soniq":
        found["enqueue"] = _measure(
            meter, lambda: raw.insert_loop(system.db, jobs, raw.SONIQ_ENQUEUE),
            lambda: _count(system.db, all_jobs), explain)
    else:
        found["enqueue"] = _measure(meter, lambda: system.action("enqueue", jobs),
                                    lambda: _count(system.db, all_jobs))
    queued = found["enqueue"]["jobs"]
    found["drain"] = _measure(meter, lambda: _drain_to_end(system, cfg, conc, run_workers),
                              lambda: system.sql(system.done_sql), explain)
    if found["drain"]["jobs"] != queued:
        raise RuntimeError(f"{name}: {found['drain']['jobs']} of {queued} jobs done")
    if name == "soniq":
        found["purge"] = _measure(meter, _soniq_purge,
                                  lambda: queued - _count(system.db, all_jobs), explain)
    else:
        found["purge"] = _measure(meter, lambda: system.action("aggregate"), lambda: queued)
    return found


def per_job(found: dict) -> tuple[float, float | None, float | None]:
    """(LSN bytes, attributed bytes, FPI bytes) per job of one phase."""
    jobs = max(1, found["jobs"])
    return (found["lsn"] / jobs,
            None if found["attributed"] is None else found["attributed"] / jobs,
            None if found["fpi"] is None else found["fpi"] / jobs)


def measure(cfg, systems, raw_db: str, res, run_workers) -> None:
    """One repetition: every phase of raw, soniq and (if present) pgqueuer."""
    for name in SYSTEMS:
        if name != "raw" and name not in systems:
            continue
        found = measure_system(name, cfg, systems, raw_db, run_workers)
        for phase in PHASES:
            lsn, attributed, fpi = per_job(found[phase])
            if not found[phase].get("unreadable"):  # never the noisier LSN in its place
                res.add(f"wal.{name}.{phase}", attributed if attributed is not None else lsn)
            res.add(f"wal.{name}.{phase}.lsn", lsn)
            if fpi is not None:
                res.add(f"wal.{name}.{phase}.fpi", fpi)
        for phase in PHASES:
            if "records" in found[phase]:
                print(format_explain(phase, found[phase]["records"], found[phase]["jobs"]),
                      flush=True)


def format_explain(phase: str, rows: list[tuple], jobs: int) -> str:
    lines = [f"  soniq {phase}: WAL by relation and record ({jobs:,} jobs; bytes per job)",
             f"    {'relation':<34}{'rmgr/record':<24}{'FPI':>4}{'records/job':>12}"
             f"{'B/job':>9}{'of it FPI':>10}"]
    for relation, rmgr, kind, has_fpi, count, size, fpi in rows:
        lines.append(f"    {relation[:33]:<34}{(rmgr + '/' + kind)[:23]:<24}"
                     f"{'yes' if has_fpi else '':>4}{count / jobs:>12.2f}{size / jobs:>9.1f}"
                     f"{fpi / jobs:>10.1f}")
    return "\n".join(lines)


def life(res, name: str) -> float | None:
    values = [res.median(f"wal.{name}.{phase}") for phase in LIFE]
    return None if any(v is None for v in values) else sum(values)


LABELS = {
    "raw": {"enqueue": "INSERT 1 row/txn", "bulk": "COPY", "drain": "claim + complete",
            "purge": "DELETE in batches of 1,000"},
    "soniq": {"enqueue": "soniq_enqueue(), 1 job/txn", "bulk": "bulk_enqueue() (COPY)",
              "drain": "soniq_worker", "purge": "purge_expired()"},
    "pgqueuer": {"enqueue": "enqueue, 1 job/txn", "bulk": "list enqueue", "drain": "worker",
                 "purge": "log aggregation"},
}


def render(cfg, res, lines: list[str], row) -> None:
    """The WAL section: one row per system and phase, the whole life, the verdict."""
    if not any(key.startswith("wal.") for key in res.values):
        return
    how = ("attributed to each system's database (pg_walinspect)"
           if any(key.endswith(".fpi") for key in res.values) else
           "LSN difference (pg_walinspect unavailable: cluster-wide, other sessions included)")
    lines.append(f"WAL PER JOB (bytes, {how}; a CHECKPOINT before each phase; "
                 f"drains at concurrency/batch {cfg.wal_concurrency}; "
                 f"{cfg.wal_jobs:,} jobs; docs/performance.md#wal-per-job)")
    for name in SYSTEMS:
        for phase in PHASES:
            key = f"wal.{name}.{phase}"
            if key not in res.values:
                continue
            drain = f" conc {cfg.wal_concurrency}" if phase == "drain" else ""
            extra = []
            if f"{key}.fpi" in res.values:
                extra.append(f"FPI {res.median(f'{key}.fpi'):,.0f}")
            extra.append(f"LSN {res.median(f'{key}.lsn'):,.0f}")
            row(f"{name}: {LABELS[name][phase]}{drain}", key, unit="B/job",
                ratio=", ".join(extra))
    totals = {name: life(res, name) for name in SYSTEMS}
    parts = ", ".join(f"{name} {value:,.0f} B" for name, value in totals.items()
                      if value is not None)
    lines.append(f"  whole life per job (enqueue + drain + purge/aggregation): {parts}")
    soniq, pgq = totals["soniq"], totals["pgqueuer"]
    before = res.median("wal.pgqueuer.purge")
    if soniq is not None and pgq and before is not None:
        lines.append(f"  pgqueuer before its log aggregation: {pgq - before:,.0f} B "
                     f"(soniq ÷ that: {soniq / (pgq - before):.2f})")
    if soniq is not None and pgq:
        ratio = soniq / pgq
        verdict = "PASS" if ratio <= RATIO_GOAL else "MISS"
        lines.append(f"  {verdict} wal per job: soniq {soniq:,.0f} B, pgqueuer {pgq:,.0f} B, "
                     f"ratio {ratio:.2f} (target ≤ {RATIO_GOAL})")

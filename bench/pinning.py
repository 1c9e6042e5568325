"""The pinned horizon of bench/soak.py (``--pin-minutes``; issue 27): who holds the old
snapshot, how the primary shows it, and the claim probe that times claims meanwhile.

Two ways to pin the xmin horizon of the soak's cluster (``--pin-via``):

- ``session`` (the default): a session on the primary opens a ``REPEATABLE
  READ`` transaction, reads ``soniq_jobs`` once (its snapshot is taken then)
  and stays idle in it, as a long report, a ``pg_dump`` or a forgotten
  session would.
- ``standby``: a streaming standby of the soak's cluster
  (``pg_basebackup -R`` into a directory of its own under /tmp, started on
  another free port with ``hot_standby_feedback = on``, through a physical
  replication slot) runs the same transaction. The standby reports the
  snapshot's xmin to the primary, whose vacuum then keeps every row version
  newer than it, as with a report on a read replica.

Either way the primary's oldest xmin is read every minute
(``HORIZON_SQL``: sessions, WAL senders and replication slots), so the
report shows that the horizon was held, not only that a transaction was
open. The standby is always stopped and deleted: at the end, on an error
and on SIGTERM (which bench/soak.py turns into SystemExit).

Only the standard library at import time (bench/soak.py's ``--plot-only``).
"""

import shutil
import tempfile
import time
from pathlib import Path

#: How often the claim probe times a claim.
PROBE_SECONDS = 0.25
PROBE_CLAIM = ("SELECT job_id::text, generation, token, queue "
               "FROM soniq_claim_many('soak-claim-probe', ARRAY[%s], NULL, 30, 120)")
PROBE_COMPLETE = "SELECT soniq_complete(%s, 'soak-claim-probe', %s, %s, %s, NULL, 120)"
#: The standby's replication slot on the primary.
SLOT = "soniq_soak_standby"
#: How long the standby may take to replay the primary's WAL up to now, or the primary to
#: receive the pin's xmin from it (hot_standby_feedback goes with the standby's status
#: messages, every wal_receiver_status_interval: 10 s).
STANDBY_WAIT_SECONDS = 60.0

#: The primary's oldest xmin and what holds it: a session, a WAL sender (hot_standby_feedback
#: without a slot) or a replication slot (with one). ``age`` counts transaction ids since.
HORIZON_SQL = """
SELECT holder, xmin::text, age(xmin) FROM (
    SELECT 'session ' || pid AS holder, backend_xmin AS xmin FROM pg_stat_activity
     WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'
    UNION ALL
    SELECT 'walsender ' || pid, backend_xmin FROM pg_stat_replication
    UNION ALL
    SELECT 'slot ' || slot_name, xmin FROM pg_replication_slots) held
 WHERE xmin IS NOT NULL
 ORDER BY age(xmin) DESC LIMIT 1
"""


def horizon(conn) -> tuple[str, str, int] | None:
    """(holder, xmin, age) of the primary's oldest xmin, or None when nothing holds one."""
    return conn.execute(HORIZON_SQL).fetchone()


class ClaimProbe:
    """Times ``soniq_claim_many`` every PROBE_SECONDS on a connection of its own.

    Each probe claims one job of every queue, as a worker's claim does, on a
    session that claims all the time, as a worker's does (version 9 keeps
    where its claims stopped in the session), then completes it, untimed.
    ``take()`` returns the durations (ms) since the last call; ``completed``
    counts the jobs it ran, which the minute's rate adds to the handlers'.
    """

    def __init__(self, url: str):
        import threading

        self.url = url
        self.durations: list[float] = []
        self.trace: list[tuple[float, float]] = []  # (wall clock at the start, ms) of each
        self.errors = 0
        self.completed = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="claim-probe", daemon=True)

    def start(self) -> "ClaimProbe":
        self._thread.start()
        return self

    def _run(self) -> None:
        import secrets

        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop.wait(PROBE_SECONDS):
                try:
                    wall, began = time.time(), time.perf_counter()
                    claimed = conn.execute(PROBE_CLAIM, [secrets.token_hex(16)],
                                           prepare=True).fetchall()
                    took = (time.perf_counter() - began) * 1000
                    for job_id, generation, token, queue in claimed:
                        conn.execute(PROBE_COMPLETE, [job_id, generation, token, queue],
                                     prepare=True)
                except psycopg.Error:
                    self.errors += 1
                    continue
                with self._lock:
                    self.durations.append(took)
                    self.trace.append((wall, took))
                    self.completed += len(claimed)

    def take(self) -> tuple[list[float], int]:
        """The claim times (ms) and the jobs completed since the last call."""
        with self._lock:
            found, self.durations = self.durations, []
            completed, self.completed = self.completed, 0
        return found, completed

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


class Pin:
    """A session holding one snapshot: ``REPEATABLE READ``, ``soniq_jobs`` read once, then idle
    in its transaction until ``release()`` (the xmin horizon stays where it was)."""

    def __init__(self, url: str):
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        self.conn.execute("SELECT count(*) FROM soniq_jobs").fetchone()
        self.xmin = self.conn.execute("SELECT backend_xmin::text FROM pg_stat_activity "
                                      "WHERE pid = pg_backend_pid()").fetchone()[0]
        self.lost: str | None = None

    def held(self) -> bool:
        """Whether the transaction is still open: a standby cancels a query that conflicts with
        the recovery (an exclusive lock replayed from the primary, after
        max_standby_streaming_delay); the reason is kept in ``lost``."""
        import psycopg

        if self.lost is None:
            try:
                self.conn.execute("SELECT 1").fetchone()
            except psycopg.Error as error:
                self.lost = f"{type(error).__name__}: {str(error).strip().splitlines()[0]}"
        return self.lost is None

    def release(self) -> None:
        try:
            self.conn.execute("ROLLBACK")
        except Exception:  # lost already: closing is all that is left
            pass
        self.conn.close()


def wait_for_horizon(primary_conn, xmin: str, seconds: float = STANDBY_WAIT_SECONDS) -> str:
    """Wait until the primary's horizon is at ``xmin`` or older; return what holds it.

    Raises RuntimeError if it is not within ``seconds`` (hot_standby_feedback not reaching
    the primary: the run would measure nothing)."""
    deadline = time.monotonic() + seconds
    while True:
        found = horizon(primary_conn)
        if found is not None and _xid_not_after(found[1], xmin):
            return f"{found[0]} (xmin {found[1]})"
        if time.monotonic() > deadline:
            raise RuntimeError(f"the primary's horizon is not held at {xmin} after {seconds:.0f} s "
                               f"(oldest: {found})")
        time.sleep(0.5)


def _xid_not_after(a: str, b: str) -> bool:
    """32-bit transaction ids compared as PostgreSQL does (modulo 2^32): a <= b."""
    return ((int(a) - int(b)) & 0xFFFFFFFF) == 0 or ((int(a) - int(b)) & 0x80000000) != 0


def standby_of(primary, database: str, log_copy: Path | None = None):
    """A streaming standby of ``primary`` (a tests/chaos Cluster), not yet made: use it as a
    context manager, which makes it (base backup, start, catch up) and always deletes it
    (its server log copied to ``log_copy`` first)."""
    from tests.chaos.cluster import Cluster

    class Standby(Cluster):
        def create(self) -> "Standby":
            self.dir = Path(tempfile.mkdtemp(prefix="soniq-soak-standby.", dir="/tmp"))
            if self.owner:
                shutil.chown(self.dir, self.owner)
            result = self._run("pg_basebackup", "-h", "127.0.0.1", "-p", str(primary.port),
                               "-U", "postgres", "-D", str(self.data), "-R", "-X", "stream",
                               "-C", "-S", SLOT, "-c", "fast", "--no-sync")
            self._check("pg_basebackup", result)
            self.start()
            self.catch_up()
            return self

        def start(self) -> None:
            options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} "
                       "-c hot_standby_feedback=on")
            result = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log_path), "-w",
                               "-t", "120", "-o", options, "start")
            self._check("pg_ctl start (standby)", result)
            self.running = True

        def catch_up(self) -> None:
            """Wait until the standby has replayed the primary's WAL up to now."""
            import psycopg

            with psycopg.connect(primary.url("postgres"), autocommit=True) as conn:
                target = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
            deadline = time.monotonic() + STANDBY_WAIT_SECONDS
            with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
                while not conn.execute("SELECT pg_is_in_recovery() AND "
                                       "pg_last_wal_replay_lsn() >= %s::pg_lsn",
                                       [target]).fetchone()[0]:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the standby did not catch up with the primary:\n"
                                           + self.log_tail())
                    time.sleep(0.2)

        def destroy(self) -> None:
            if self.dir is not None and log_copy is not None:
                try:
                    shutil.copy(self.log_path, log_copy)
                except OSError:
                    pass
            super().destroy()

    return Standby(database=database)

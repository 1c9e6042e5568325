"""The short limits-per-key chaos run on SQLite, inside the test suite (SQLite pass).

150 ``chaos.keyed`` jobs over 10 keys at ``key_concurrency=1``, 3 worker
processes x 2 threads on one SQLite file, through a SIGKILL and a worker
SIGSTOPped past its lease; some jobs fail their first attempt (retried), some
overrun their time limit (failed at the deadline, running on holding their
key's slot). From the in-handler stamps, never two runs of a key at once, and
every job done, no key left counting (tests/chaos/sqlite_keys.py). Then, inside a
transaction that is rolled back, the check is shown two runs of a key made to
overlap and a key left counting, and must report both (and the overlap gone
once the first run's hold is made to have lapsed as it started): a check that
cannot fail proves nothing. The full run is ``make chaos-keys-sqlite``.
"""

import dataclasses
import sqlite3
import time

import pytest

from tests.chaos.keys import check_keys
from tests.chaos.sqlite_keys import SqliteKeysConfig, run, when

pytestmark = [pytest.mark.sqlite_only, pytest.mark.version_independent]

SHORT = SqliteKeysConfig(jobs=150, keys=10, workers=3, concurrency=2, kills=1, stops=1,
                         drain_timeout=150.0, stall_timeout=60.0)


def _show_the_check_a_key_overlap(path) -> None:
    conn = sqlite3.connect(path, timeout=20, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        first, second = conn.execute(
            "SELECT e.exec_id, e.started_at, e.job_id, e.attempt FROM chaos_executions AS e "
            "JOIN soniq_jobs AS j ON j.id = e.job_id WHERE j.concurrency_key = 'k0' "
            "ORDER BY e.started_at LIMIT 2").fetchall()
        conn.execute("UPDATE chaos_executions SET finished_at = ? WHERE exec_id = ?",
                     ["9000-01-01 00:00:00.000000", first[0]])
        # Its hold given back as it started, its lease still running: no lapse, so the
        # run still held its key (only a lapsed hold ends a run early).
        conn.execute("DELETE FROM chaos_hold_ends WHERE job_id = ?", [first[2]])
        conn.execute("INSERT INTO chaos_hold_ends (job_id, generation, lease_expires_at, at) "
                     "VALUES (?, ?, '8999-01-01 00:00:00.000000', ?)",
                     [first[2], first[3], first[1]])
        conn.execute("UPDATE soniq_key_slots SET running = 1 WHERE key = 'k1'")
        found = check_keys(conn, when=when)
        # The same hold lapsed instead, as the run started: the run gave its key back
        # then, and the overlap made above is gone.
        conn.execute("UPDATE chaos_hold_ends SET lease_expires_at = at WHERE job_id = ?",
                     [first[2]])
        cut = check_keys(conn, when=when)
        conn.execute("ROLLBACK")
    finally:
        conn.close()
    assert found.overlaps >= 1, found.violations
    assert any("still counting" in line for line in found.leftovers), found.leftovers
    assert cut.overlaps == found.overlaps - 1, cut.violations
    assert cut.runs_cut_by_hold_lapse == found.runs_cut_by_hold_lapse + 1
    _show_the_check_a_key_overlap.seen = True


def test_short_sqlite_keys_run_never_runs_two_jobs_of_a_key_at_once(tmp_path):
    started = time.monotonic()
    _show_the_check_a_key_overlap.seen = False
    outcome = run(dataclasses.replace(SHORT, log_dir=tmp_path), say=print,
                  inspect=_show_the_check_a_key_overlap)
    print(outcome.summary())
    print(f"short SQLite keys chaos run: {time.monotonic() - started:.1f} s")
    assert outcome.ok, "\n".join(outcome.failures()[:40])
    assert outcome.kills == 1 and outcome.stops == 1
    assert outcome.keys.keys == 10 and outcome.keys.overlaps == 0
    assert not outcome.keys.leftovers and outcome.done == SHORT.jobs
    assert _show_the_check_a_key_overlap.seen

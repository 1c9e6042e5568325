"""Limits per key (issue 31): what a claim costs beside held-back keyed jobs, and how long
quiet keys wait beside a busy one. ``python -m bench.keys`` (``make bench-keys``).

Runs against its own PostgreSQL database (``--database``, default
``bench_soniq_keys`` on ``SONIQ_BENCH_URL`` or 127.0.0.1:5432, user postgres),
created and migrated fresh, from raw psycopg connections calling the SQL
functions a worker calls (``soniq_claim_many``, ``soniq_complete``):

1. **Claim cost.** The median time of one ``soniq_claim_many`` of one job
   (its completion outside the timing), over ``--claims`` claims, of a queue
   of plain jobs: alone, then beside 100,000 held-back keyed jobs over 1,000
   keys (each key at its limit of 1, its one job running), in the same queue;
   and the claim of keyed jobs themselves (1,000 keys, each offering one job:
   the claim's transaction pays the key's trigger).
2. **Quiet keys' wait.** One busy key with 10,000 jobs, enqueued first, and
   nine quiet keys with 10 jobs each; 4 claimer threads take batches of 4
   and "run" each job for 2 ms. The time until the last quiet job started,
   with the keys (``key_concurrency=2``) and without them (the same jobs,
   plain): without keys the quiet jobs wait behind the backlog.
"""

import argparse
import os
import statistics
import threading
import time
import uuid

import psycopg

CLAIM = "SELECT job_id, generation, token, queue FROM soniq_claim_many(%s, %s::text[], NULL, 30)"
COMPLETE = "SELECT soniq_complete(%s, %s, %s, %s, %s)"


def _url(database: str) -> str:
    base = os.environ.get("SONIQ_BENCH_URL", "postgresql://postgres@127.0.0.1:5432/")
    return base.rsplit("/", 1)[0] + "/" + database


def _fresh(database: str) -> None:
    with psycopg.connect(_url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{database}"')
    os.environ["SONIQ_TEST_BACKEND"] = "postgresql"
    os.environ["SONIQ_TEST_DATABASE_URL"] = _url(database)
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            DATABASES={"default": {"ENGINE": "django.db.backends.postgresql",
                                   "NAME": database, "USER": "postgres",
                                   "HOST": "127.0.0.1", "PORT": "5432"}},
            INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth",
                            "soniq_django"],
            USE_TZ=True, SONIQ={})
        django.setup()
    from django.core.management import call_command

    call_command("migrate", "soniq_django", verbosity=0)


def _reset(conn) -> None:
    conn.execute("SELECT set_config('soniq.fenced_write', 'on', false)")
    conn.execute("TRUNCATE soniq_jobs, soniq_dead_letter_jobs, soniq_key_slots, soniq_key_parked, "
                 "soniq_key_starts, soniq_key_holds, soniq_key_limits, soniq_queue_holds")
    conn.execute("SELECT set_config('soniq.fenced_write', 'off', false)")
    conn.execute("VACUUM ANALYZE soniq_jobs")


def _claims(conn, count: int) -> list[float]:
    """``count`` claims of one job, each timed; each job completed outside the timing."""
    times = []
    for _ in range(count):
        token = uuid.uuid4().hex
        started = time.perf_counter()
        row = conn.execute(CLAIM, ["bench-worker", [token]]).fetchone()
        times.append(time.perf_counter() - started)
        if row is None:
            raise RuntimeError("nothing to claim")
        job_id, generation, token, queue = row
        conn.execute(COMPLETE, [str(job_id), "bench-worker", generation, token, queue])
    return times


def load_plain(conn, count: int) -> None:
    """``count`` plain jobs in the default queue."""
    conn.execute("SELECT soniq_enqueue('bench.plain', jsonb_build_object('n', g)) "
                 "FROM generate_series(1, %s) AS g", [count])
    conn.execute("ANALYZE soniq_jobs")


def load_held(conn, held: int, keys: int) -> int:
    """``held`` + ``keys`` keyed jobs over ``keys`` keys at a limit of 1, each key's offered
    job claimed and left running (a lease of an hour): the rest held back. Returns how many
    are held back (parked). bench/scale.py's part 5 loads its database with it too."""
    # As producers do: transactions of 2,000 jobs; ANALYZE as autovacuum would (a plan
    # cached while the table looked empty reads it whole, see docs/keys.md).
    for start in range(0, held + keys, 2000):
        if start % 20_000 == 0:
            conn.execute("ANALYZE soniq_jobs")
        conn.execute("SELECT soniq_enqueue_keyed('key-' || (g %% %s), 1, NULL, "
                     "'bench.keyed', jsonb_build_object('n', g)) "
                     "FROM generate_series(%s::int, %s::int) AS g",
                     [keys, start + 1, min(start + 2000, held + keys)])
    taken = 0
    while taken < keys:
        rows = conn.execute("SELECT count(*) FROM soniq_claim_many('holder', %s::text[], "
                            "NULL, 3600)", [[uuid.uuid4().hex for _ in range(100)]]
                            ).fetchone()[0]
        if not rows:
            break
        taken += rows
    conn.execute("ANALYZE soniq_jobs")
    return int(conn.execute("SELECT count(*) FROM soniq_key_parked").fetchone()[0])


def load_offered(conn, count: int) -> None:
    """``count`` keys, each offering its one job (the claim of one pays its key's trigger)."""
    conn.execute("SELECT soniq_enqueue_keyed('key-' || g, 1, NULL, 'bench.keyed', "
                 "jsonb_build_object('n', g)) FROM generate_series(1, %s) AS g", [count])
    conn.execute("ANALYZE soniq_jobs")


def claim_cost(url: str, claims: int, held: int, keys: int) -> dict[str, float]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        results = {}
        _reset(conn)
        load_plain(conn, claims + 100)
        results["plain jobs alone"] = statistics.median(_claims(conn, claims))
        _reset(conn)
        parked = load_held(conn, held, keys)
        load_plain(conn, claims + 100)
        results[f"plain jobs beside {parked:,} held-back keyed jobs over {keys:,} keys"] = (
            statistics.median(_claims(conn, claims)))
        _reset(conn)
        load_offered(conn, claims + 100)
        results["keyed jobs (each key offering one)"] = statistics.median(_claims(conn, claims))
    return results


def quiet_wait(url: str, keyed: bool, busy: int = 10_000, quiet: int = 9, each: int = 10,
               threads: int = 4, batch: int = 4, work: float = 0.002) -> float:
    """Seconds from the first claim until the last quiet job started."""
    with psycopg.connect(url, autocommit=True) as conn:
        _reset(conn)
        if keyed:
            for start in range(0, busy, 2000):
                if start % 20_000 == 0:
                    conn.execute("ANALYZE soniq_jobs")
                conn.execute("SELECT soniq_enqueue_keyed('busy', 2, NULL, 'bench.busy', "
                             "jsonb_build_object('n', g)) "
                             "FROM generate_series(%s::int, %s::int) AS g",
                             [start + 1, min(start + 2000, busy)])
            conn.execute("SELECT soniq_enqueue_keyed('quiet-' || (g %% %s), 2, NULL, "
                         "'bench.quiet', jsonb_build_object('n', g)) "
                         "FROM generate_series(1, %s) AS g", [quiet, quiet * each])
        else:
            conn.execute("SELECT soniq_enqueue('bench.busy', jsonb_build_object('n', g)) "
                         "FROM generate_series(1, %s) AS g", [busy])
            conn.execute("SELECT soniq_enqueue('bench.quiet', jsonb_build_object('n', g)) "
                         "FROM generate_series(1, %s) AS g", [quiet * each])
        conn.execute("ANALYZE soniq_jobs")
    left = [quiet * each]
    lock = threading.Lock()
    done_at: list[float] = []
    start = time.perf_counter()

    def claimer(index: int) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SET synchronous_commit = off")
            while True:
                with lock:
                    if left[0] <= 0:
                        return
                rows = conn.execute(
                    "SELECT job_id, generation, token, queue, job_name FROM soniq_claim_many("
                    "%s, %s::text[], NULL, 30)",
                    [f"w{index}", [uuid.uuid4().hex for _ in range(batch)]]).fetchall()
                for job_id, generation, token, queue, name in rows:
                    if name == "bench.quiet":
                        with lock:
                            left[0] -= 1
                            if left[0] == 0:
                                done_at.append(time.perf_counter())
                    time.sleep(work)
                    conn.execute(COMPLETE, [str(job_id), f"w{index}", generation, token, queue])
                if not rows:
                    time.sleep(0.001)

    workers = [threading.Thread(target=claimer, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(600)
    return done_at[0] - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.keys", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database", default="bench_soniq_keys")
    parser.add_argument("--claims", type=int, default=1000)
    parser.add_argument("--held", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--busy", type=int, default=10_000)
    args = parser.parse_args(argv)
    _fresh(args.database)
    url = _url(args.database)
    print(f"claim cost: median of {args.claims} claims of one job (soniq_claim_many)")
    for label, seconds in claim_cost(url, args.claims, args.held, args.keys).items():
        print(f"  {label:<62} {seconds * 1000:7.3f} ms")
    print(f"quiet keys' wait: 1 busy key of {args.busy:,} jobs, 9 quiet keys of 10, "
          "4 claimers x batches of 4, 2 ms a job")
    for keyed in (True, False):
        seconds = quiet_wait(url, keyed, busy=args.busy)
        print(f"  {'with keys (key_concurrency=2)' if keyed else 'without keys (plain jobs)':<40}"
              f" last quiet job started after {seconds:7.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

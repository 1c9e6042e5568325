"""The admin at a million rows: ``python -m bench.admin`` (``make bench-admin``).

Issue 28, item 7 (docs/performance.md "The admin at a million rows"). In a
database of its own, ``soniq_bench_<pid>_admin`` (dropped at the end): migrate,
then fill ``soniq_jobs`` with 1,000,000 rows in mixed states and
``soniq_dead_letter_jobs`` with 100,000 in one INSERT ... SELECT each (as
bench/scale.py loads its depths), then VACUUM ANALYZE. Then every admin page
an operator uses is requested through Django's test client as a superuser,
in this process (so the time is the server's: the view, its queries and the
template, no network or browser), ``--repeat`` times after one warm-up
request, and each page's median and max are printed against the 300 ms
target, with the number of SQL queries it ran (one more request of its own,
with the queries captured) and the slowest of them.

The rows, out of 1,000,000 jobs (``--jobs``) spread over the last three days
in 8 queues (unevenly: "default" has 40 % of them, "low" 2 %) and 12 job
names, with args as an application writes them (an order id, a customer,
an e-mail address, an amount, a list of items):

- 20 % queued and due, 5 % queued for a later ``run_at``, 3 % waiting for a
  retry (tried before, with an error, a ``run_at`` ahead and attempt rows);
- 0.2 % processing, with a lease, a claim and a live worker;
- 67.8 % done with a result, 4 % cancelled, both with ``expires_at`` set.

100,000 dead letters (``--dead``) over the last 30 days, by four reasons,
each with a traceback; one in ten replayed. Four live workers (and twenty
stopped ones), their task registry, an hour of throughput, and three queue
settings rows (a concurrency limit, a rate limit, a pause).
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

from bench.common import connect, create_database, drop_database

TARGET_MS = 300.0

QUEUES = ("default",) * 20 + ("emails",) * 10 + ("reports",) * 5 + ("billing",) * 5 + (
    "webhooks",) * 4 + ("imports",) * 3 + ("thumbnails",) * 2 + ("low",)
"""Fifty slots: a job's queue is the slot its number falls in (so 40 % are "default")."""
NAMES = ("shop.send_receipt", "shop.charge_card", "shop.refund", "shop.sync_stock",
         "mail.send_newsletter", "mail.bounce", "reports.daily_sales", "reports.export_csv",
         "hooks.deliver", "imports.catalog", "media.thumbnail", "misc.cleanup")
WORKERS = ("11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222",
           "33333333-3333-4333-8333-333333333333", "44444444-4444-4444-8444-444444444444")

#: One job per g; its state by g % 1000 (see the module's docstring), its queue
#: by (g * 7 + g / 1000) % 50 in QUEUES, its job name by g % 12, created over three days.
JOBS_SQL = """
INSERT INTO soniq_jobs (id, job_name, args, args_hash, status, attempts, max_attempts, queue,
                        priority, unique_job, dedup_key, scheduled_at, expires_at, last_error,
                        result, producer_id, worker_id, created_at, updated_at, claim_generation,
                        claim_token, claim_owner, lease_expires_at, pid, claimed_at)
SELECT gen_random_uuid(), names[1 + g %% 12],
       jsonb_build_object('order_id', g, 'customer', 'cust-' || (g * 31) %% 50000,
                          'email', 'user' || g %% 200000 || '@example.com',
                          'amount_cents', (g * 17) %% 100000, 'currency', 'EUR',
                          'items', jsonb_build_array(jsonb_build_object('sku', 'SKU-' || g %% 5000,
                                                                        'qty', 1 + g %% 3)),
                          'locale', CASE WHEN g %% 5 = 0 THEN 'de' ELSE 'en' END),
       md5(g::text), state, attempts, 4, queues[1 + (g * 7 + g / 1000) %% 50],
       CASE WHEN g %% 10 = 0 THEN 50 ELSE 100 END, false,
       CASE WHEN g %% 20 = 0 THEN 'order-' || g END,
       CASE WHEN kind IN ('later', 'retry') THEN now() + (g %% 3600) * interval '1 second'
            WHEN kind = 'due' AND g %% 4 = 0 THEN created END,
       CASE WHEN state IN ('done', 'cancelled') THEN now() + interval '1 day' END,
       CASE WHEN kind = 'retry' THEN 'Traceback (most recent call last):' || chr(10)
            || '  File "shop/jobs.py", line 42, in charge_card' || chr(10)
            || 'ConnectionError: payment gateway timed out after 30 s (attempt '
            || attempts || ')' END,
       CASE WHEN state = 'done' THEN jsonb_build_object('ok', true, 'message_id', md5(g::text))
            END,
       'web-' || g %% 4,
       CASE WHEN state IN ('processing', 'done') THEN workers[1 + g %% 4]::uuid END,
       created, CASE WHEN state = 'queued' AND kind = 'due' THEN created
                     ELSE least(created + interval '2 seconds', now()) END,
       CASE WHEN attempts > 0 THEN attempts ELSE 0 END,
       CASE WHEN state = 'processing' THEN md5('token' || g) END,
       CASE WHEN state IN ('processing', 'done') THEN workers[1 + g %% 4] END,
       CASE WHEN state = 'processing' THEN now() + interval '30 seconds' END,
       CASE WHEN state = 'processing' THEN 1000 + g %% 4 END,
       CASE WHEN state = 'processing' THEN now() - interval '5 seconds'
            WHEN attempts > 0 THEN least(created + interval '1 second', now()) END
  FROM (SELECT g, names, queues, workers,
               now() - (%(jobs)s - g) * (interval '3 days' / %(jobs)s) AS created,
               CASE WHEN g %% 1000 < 200 THEN 'due' WHEN g %% 1000 < 250 THEN 'later'
                    WHEN g %% 1000 < 280 THEN 'retry' WHEN g %% 1000 < 282 THEN 'processing'
                    WHEN g %% 1000 < 960 THEN 'done' ELSE 'cancelled' END AS kind
          FROM generate_series(1, %(jobs)s) AS g,
               (SELECT %(names)s::text[] AS names, %(queues)s::text[] AS queues,
                       %(workers)s::text[] AS workers) AS c) AS s,
       LATERAL (SELECT CASE WHEN kind IN ('due', 'later', 'retry') THEN 'queued'
                            WHEN kind = 'processing' THEN 'processing' ELSE kind END AS state,
                       CASE WHEN kind = 'retry' THEN 1 + g %% 3 WHEN kind = 'later' THEN 0
                            WHEN kind = 'due' THEN 0 ELSE 1 END AS attempts) AS t
"""

#: The retrying jobs' failed attempts (as the attempt trigger writes them).
ATTEMPTS_SQL = """
INSERT INTO soniq_job_attempts (job_id, attempt, generation, worker_id, claim_owner, claimed_at,
                                ended_at, outcome, error)
SELECT j.id, a, a, %(worker)s::uuid, %(worker)s, j.created_at + a * interval '1 second',
       j.created_at + a * interval '1 second' + interval '30 seconds', 'failed', j.last_error
  FROM soniq_jobs AS j, generate_series(1, 3) AS a
 WHERE j.status = 'queued' AND j.attempts >= a
"""

#: Dead letters over 30 days, by four reasons, each with a traceback; one in ten replayed.
DEAD_SQL = """
INSERT INTO soniq_dead_letter_jobs (id, job_name, args, queue, priority, max_attempts, attempts,
                                    last_error, dead_letter_reason, original_created_at,
                                    moved_to_dead_letter_at, resurrection_count,
                                    last_resurrection_at, tags)
SELECT gen_random_uuid(), names[1 + g %% 12],
       jsonb_build_object('order_id', 5000000 + g, 'customer', 'cust-' || (g * 37) %% 50000),
       queues[1 + (g * 7) %% 50], 100, 4, 4,
       'Traceback (most recent call last):' || chr(10) || '  File "shop/jobs.py", line '
       || g %% 300 || ', in handler' || chr(10) || 'ValueError: order ' || (5000000 + g)
       || ' cannot be charged: card declined (' || md5(g::text) || ')',
       (ARRAY['max_retries_exceeded', 'max_retries_exceeded', 'permanent_failure',
              'job_not_found', 'invalid_arguments'])[1 + g %% 5],
       moved - interval '10 minutes', moved,
       CASE WHEN g %% 10 = 0 THEN 1 ELSE 0 END,
       CASE WHEN g %% 10 = 0 THEN moved + interval '1 hour' END,
       jsonb_build_object('source', 'bench')
  FROM (SELECT g, now() - (%(dead)s - g) * (interval '30 days' / %(dead)s) AS moved
          FROM generate_series(1, %(dead)s) AS g) AS s,
       (SELECT %(names)s::text[] AS names, %(queues)s::text[] AS queues) AS c
"""

SIDE_SQL = [
    # Four live workers (heartbeats kept fresh by ``heartbeat``), twenty stopped.
    """INSERT INTO soniq_workers (id, hostname, pid, queues, concurrency, status, last_heartbeat,
                                  started_at, version, metadata)
       SELECT w::uuid, 'web-' || i, 1000 + i, '{}'::text[], 8, 'active', now(),
              now() - interval '2 hours', 'soniq_django bench', '{}'
         FROM unnest(%(workers)s::text[]) WITH ORDINALITY AS u(w, i)""",
    """INSERT INTO soniq_workers (id, hostname, pid, queues, concurrency, status, last_heartbeat,
                                  started_at, version, metadata)
       SELECT gen_random_uuid(), 'old-' || i, 2000 + i, '{}'::text[], 4, 'stopped',
              now() - interval '1 day', now() - interval '2 days', 'soniq_django bench', '{}'
         FROM generate_series(1, 20) AS i""",
    """INSERT INTO soniq_task_registry (task_name, worker_id, last_seen_at, queue, max_attempts,
                                        unique_job)
       SELECT n, w, now(), 'default', 4, false
         FROM unnest(%(names)s::text[]) AS n, unnest(%(workers)s::text[]) AS w""",
    """INSERT INTO soniq_throughput (minute, queue, done, failed, dead_lettered, cancelled)
       SELECT date_trunc('minute', now()) - m * interval '1 minute', q, 200 + m, m %% 7, m %% 3,
              m %% 5
         FROM generate_series(0, 59) AS m,
              unnest(ARRAY['default', 'emails', 'reports', 'billing', 'webhooks', 'imports',
                           'thumbnails', 'low']) AS q""",
    """INSERT INTO soniq_queue_settings (queue, paused, concurrency, updated_at)
       VALUES ('reports', false, 2, now())""",
    """INSERT INTO soniq_queue_settings (queue, paused, rate_limit, rate_period, updated_at)
       VALUES ('webhooks', false, 100, 60, now())""",
    """INSERT INTO soniq_queue_settings (queue, paused, paused_at, paused_by, updated_at)
       VALUES ('low', true, now(), 'bench', now())""",
]


def fill(db: str, jobs: int, dead: int) -> float:
    """Fill the tables, VACUUM ANALYZE, CHECKPOINT; return the seconds taken."""
    started = time.perf_counter()
    params = {"jobs": jobs, "dead": dead, "names": list(NAMES), "queues": list(QUEUES),
              "workers": list(WORKERS), "worker": WORKERS[0]}
    with connect(db) as conn:
        conn.execute(JOBS_SQL, params)
        conn.execute(ATTEMPTS_SQL, params)
        conn.execute(DEAD_SQL, params)
        for statement in SIDE_SQL:
            conn.execute(statement, params)
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")
    return time.perf_counter() - started


def heartbeat(db: str) -> None:
    """Keep the live workers live (the dashboard counts a heartbeat of the last minute)."""
    with connect(db) as conn:
        conn.execute("UPDATE soniq_workers SET last_heartbeat = now() WHERE status = 'active'")


# The pages -----------------------------------------------------------------------


@dataclass
class Page:
    name: str
    url: str
    times: list[float] = field(default_factory=list)
    queries: int = 0
    slowest: tuple[float, str] = (0.0, "")
    status: int = 0
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def worst(self) -> float:
        return max(self.times)


def pages(db: str) -> list[Page]:
    """The pages an operator uses, with rows of this database to open and search for."""
    with connect(db) as conn:
        job_id = conn.execute(
            "SELECT id FROM soniq_jobs WHERE status = 'queued' AND attempts = 3 "
            "ORDER BY created_at DESC LIMIT 1").fetchone()[0]
        done_id = conn.execute(
            "SELECT id FROM soniq_jobs WHERE status = 'done' ORDER BY created_at LIMIT 1 "
            "OFFSET 1000").fetchone()[0]
        dead_id = conn.execute(
            "SELECT id FROM soniq_dead_letter_jobs ORDER BY moved_to_dead_letter_at "
            "LIMIT 1 OFFSET 500").fetchone()[0]
    jobs, dead = "/admin/soniq_django/job/", "/admin/soniq_django/deadletterjob/"
    prefix = str(done_id).replace("-", "")[:8]
    return [
        Page("dashboard", "/admin/soniq_django/dashboard/"),
        Page("dashboard live JSON", "/admin/soniq_django/dashboard/live/"),
        Page("jobs list", jobs),
        Page("jobs list page 200", f"{jobs}?p=200"),
        Page("jobs by queue", f"{jobs}?queue=emails"),
        Page("jobs by small queue", f"{jobs}?queue=low"),
        Page("jobs by status queued", f"{jobs}?status__exact=queued"),
        Page("jobs by status done", f"{jobs}?status__exact=done"),
        Page("jobs by status processing", f"{jobs}?status__exact=processing"),
        Page("jobs by queue and status", f"{jobs}?queue=billing&status__exact=queued"),
        Page("jobs search id prefix", f"{jobs}?q={prefix}"),
        Page("jobs search whole id", f"{jobs}?q={done_id}"),
        Page("jobs search args", f"{jobs}?q=customer%3Dcust-4242"),
        Page("jobs search args number", f"{jobs}?q=order_id%3D777777"),
        Page("jobs search job name", f"{jobs}?q=refund"),
        Page("job page", f"{jobs}{job_id}/change/"),
        Page("dead letters list", dead),
        Page("dead letters by reason", f"{dead}?dead_letter_reason__exact=permanent_failure"),
        Page("dead letters by queue", f"{dead}?queue=billing"),
        Page("dead letter page", f"{dead}{dead_id}/change/"),
    ]


def measure(db: str, repeat: int) -> list[Page]:
    """Request every page (one warm-up, then ``repeat`` timed, then one counted)."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    user = get_user_model().objects.create_superuser("bench", "bench@example.com", None)
    client = Client()
    client.force_login(user)
    found = pages(db)
    for page in found:
        heartbeat(db)
        page.status = client.get(page.url).status_code
        for _ in range(repeat):
            started = time.perf_counter()
            client.get(page.url)
            page.times.append((time.perf_counter() - started) * 1000)
        with CaptureQueriesContext(connection) as captured:
            client.get(page.url)
        page.queries = len(captured)
        page.slowest = max(((float(q["time"]) * 1000, q["sql"]) for q in captured),
                           default=(0.0, ""))
        print(f"admin: {page.name}: median {page.median:.0f} ms, {page.queries} queries",
              flush=True)
    return found


def render(found: list[Page], jobs: int, dead: int, filled: float, repeat: int,
           show_sql: bool) -> list[str]:
    width = max(len(page.name) for page in found)
    lines = [f"Admin pages at {jobs:,} jobs and {dead:,} dead letters (filled in {filled:.0f} s); "
             f"{repeat} requests each after one warm-up, server-side (Django's test client, "
             "in-process), as a superuser",
             "",
             f"  {'page':<{width}}  status  median ms  max ms  queries  slowest query ms",
             f"  {'-' * width}  ------  ---------  ------  -------  ----------------"]
    for page in found:
        lines.append(f"  {page.name:<{width}}  {page.status:>6}  {page.median:>9.1f}  "
                     f"{page.worst:>6.1f}  {page.queries:>7}  {page.slowest[0]:>16.1f}")
    lines.append("")
    for page in found:
        verdict = "PASS" if page.median <= TARGET_MS and page.status == 200 else "FAIL"
        lines.append(f"{verdict} {page.name} {page.median:.0f} ms "
                     f"(max {page.worst:.0f} ms; target ≤ {TARGET_MS:.0f} ms)")
    if show_sql:
        lines.append("")
        for page in found:
            lines.append(f"slowest query of {page.name} ({page.slowest[0]:.1f} ms): "
                         f"{page.slowest[1][:600]}")
    return lines


def header() -> str:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except Exception:
            return "?"

    with connect("postgres") as conn:
        show = {name: conn.execute(f"SHOW {name}").fetchone()[0] for name in
                ("server_version", "shared_buffers", "work_mem", "jit")}
    import django

    dirty = " + uncommitted changes" if git("status", "--porcelain", "soniq_django") else ""
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"soniq_django admin benchmark — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
            f"HEAD {git('rev-parse', '--short', 'HEAD')}{dirty}, Django {django.get_version()}\n"
            f"PostgreSQL {show['server_version']} (shared_buffers={show['shared_buffers']}, "
            f"work_mem={show['work_mem']}, jit={show['jit']}), {os.cpu_count()} CPUs, "
            f"load average {load} at the end")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.admin", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1_000_000, help="rows of soniq_jobs")
    parser.add_argument("--dead", type=int, default=100_000, help="rows of the dead letters")
    parser.add_argument("--repeat", type=int, default=7, help="timed requests per page")
    parser.add_argument("--database", help="measure this filled database again (made by "
                                           "--keep); no migrate, no fill, not dropped")
    parser.add_argument("--keep", action="store_true", help="keep the database at the end")
    parser.add_argument("--sql", action="store_true", help="print each page's slowest query")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(sys.argv[1:] if argv is None else argv)
    db = cfg.database or f"soniq_bench_{os.getpid()}_admin"
    os.environ["BENCH_DB_NAME"] = db
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.admin_settings"
    import django
    from django.core.management import call_command

    created = False
    try:
        filled = 0.0
        if not cfg.database:
            print(f"admin: database {db}", flush=True)
            create_database(db)
            created = True
        django.setup()
        if not cfg.database:
            call_command("migrate", verbosity=0)
            filled = fill(db, cfg.jobs, cfg.dead)
            print(f"admin: filled in {filled:.0f} s", flush=True)
        else:
            call_command("migrate", verbosity=0)
            with connect(db) as conn:
                conn.execute("DELETE FROM auth_user WHERE username = 'bench'")
                conn.execute("ANALYZE")
        found = measure(db, cfg.repeat)
        from django.db import connections

        connections.close_all()
        print("\n".join([header(), "", *render(found, cfg.jobs, cfg.dead, filled, cfg.repeat,
                                               cfg.sql)]))
        return 0 if all(page.median <= TARGET_MS and page.status == 200 for page in found) else 1
    except KeyboardInterrupt:
        print("admin: interrupted", file=sys.stderr)
        return 130
    finally:
        if created and not cfg.keep:
            try:
                from django.db import connections

                connections.close_all()
                drop_database(db)
            except Exception as error:
                print(f"admin: could not drop {db}: {error}", file=sys.stderr)
        elif created:
            print(f"admin: kept {db} (python -m bench.admin --database {db})", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())

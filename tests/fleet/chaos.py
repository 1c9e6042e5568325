"""``python -m tests.fleet.chaos``: the long mixed-fleet run (``make chaos-fleet``).

A private PostgreSQL cluster (tests/chaos/cluster.py), migrated; a role with
``soniq_grant --worker`` alone (and INSERT on the run's effect table) for the
Node workers (contrib/node-worker, handlers tests/fleet/node_handlers.js);
soniq_django workers with tests/fleet/jobs.py. One queue, two job names:
``fleet.effect``, which both languages run (each writes one effect row in the
transaction of its completion), and ``fleet.node_only``, which only the Node
workers know (the Python workers run with ``UNKNOWN_JOB_GRACE_SECONDS=0``:
without the Node workers' registration they would dead-letter it at once).

While the jobs drain, at random moments: SIGKILL a Node worker (a new one
takes its place), SIGSTOP one past three leases then SIGCONT it, SIGKILL a
Python worker (replaced), terminate some Node backends. At the end every
worker gets SIGTERM and must exit 0, and the database must show: every job
done, none in the dead letters, exactly one effect row per job, written by
the generation that completed it. The figures go to stdout (and
docs/reliability.md). Exit status 0 only for a clean run.
"""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psycopg

from tests.chaos.cluster import Cluster, ClusterUnavailable
from tests.support.node import NodeUnavailable, NodeWorkers
from tests.support.processes import Processes

HANDLERS = Path(__file__).with_name("node_handlers.js")
ROLE = "fleet_node"
APP_NAME = "soniq-fleet-node"


def prepare(cluster: Cluster, folder: Path, shared: int, node_only: int, rng: random.Random):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.worker_settings",
           "SONIQ_WORKER_DATABASE_URL": cluster.url()}
    root = Path(__file__).resolve().parents[2]
    for command in (["migrate", "-v0"], ["soniq_grant", "--worker", ROLE]):
        if command[0] == "soniq_grant":
            with psycopg.connect(cluster.url(), autocommit=True) as conn:
                conn.execute(f"CREATE ROLE {ROLE} LOGIN")
        subprocess.run([sys.executable, "manage.py", *command], cwd=root, env=env, check=True,
                       capture_output=True)
    jobs = ([{"job_name": "fleet.effect", "args": {"ms": rng.randint(20, 200)}, "queue": "fleet"}
             for _ in range(shared)]
            + [{"job_name": "fleet.node_only", "args": {"ms": rng.randint(20, 200)},
                "queue": "fleet"} for _ in range(node_only)])
    rng.shuffle(jobs)
    with psycopg.connect(cluster.url(), autocommit=True) as conn:
        conn.execute("CREATE TABLE fleet_effects (job_id uuid NOT NULL, generation bigint "
                     "NOT NULL, runner text NOT NULL)")
        conn.execute(f"GRANT INSERT ON fleet_effects TO {ROLE}")
        for start in range(0, len(jobs), 1000):
            conn.execute("SELECT soniq_enqueue_many(%s::jsonb)",
                         [json.dumps(jobs[start:start + 1000])])


def _holding_a_claim(conn, workers):
    """A Node worker whose claim is running now (a stop then outlasts a live claim)."""
    ids = {event["worker"]: worker for worker in workers for event in worker.events("started")}
    row = conn.execute("SELECT claim_owner FROM soniq_jobs WHERE status = 'processing' "
                       "AND claim_owner = ANY(%s) LIMIT 1", [list(ids)]).fetchone()
    return ids[row[0]] if row else None


def check(url: str) -> dict:
    with psycopg.connect(url, autocommit=True) as conn:
        one = lambda sql: conn.execute(sql).fetchone()[0]  # noqa: E731
        return {
            "jobs": one("SELECT count(*) FROM soniq_jobs"),
            "done": one("SELECT count(*) FROM soniq_jobs WHERE status = 'done'"),
            "dead_letters": one("SELECT count(*) FROM soniq_dead_letter_jobs"),
            "effects": one("SELECT count(*) FROM fleet_effects"),
            "jobs_without_one_effect": one(
                "SELECT count(*) FROM soniq_jobs AS j WHERE (SELECT count(*) FROM fleet_effects "
                "AS e WHERE e.job_id = j.id) <> 1"),
            "effects_of_a_stale_generation": one(
                "SELECT count(*) FROM fleet_effects AS e JOIN soniq_jobs AS j ON j.id = e.job_id "
                "WHERE e.generation <> j.claim_generation"),
            "node_only_run_by_python": one(
                "SELECT count(*) FROM fleet_effects AS e JOIN soniq_jobs AS j ON j.id = e.job_id "
                "WHERE j.job_name = 'fleet.node_only' AND e.runner <> 'node'"),
            "effects_by_runner": dict(conn.execute(
                "SELECT runner, count(*) FROM fleet_effects GROUP BY runner").fetchall()),
            "retried_attempts": one("SELECT count(*) FROM soniq_job_attempts"),
            "attempt_outcomes": dict(conn.execute(
                "SELECT outcome, count(*) FROM soniq_job_attempts GROUP BY outcome").fetchall()),
        }


def run(args) -> int:
    rng = random.Random(args.seed)
    folder = Path(tempfile.mkdtemp(prefix="soniq-fleet-chaos."))
    with Cluster(database="soniq_fleet") as cluster:
        prepare(cluster, folder, args.jobs - args.node_only, args.node_only, rng)
        url = cluster.url()
        node_url = f"postgres://{ROLE}@127.0.0.1:{cluster.port}/soniq_fleet" \
                   f"?application_name={APP_NAME}"
        nodes = NodeWorkers(folder, node_url, HANDLERS, queues="fleet", lease_seconds=args.lease,
                            heartbeat_seconds=args.lease / 4, poll_interval=0.5)
        python = Processes(folder, "tests.worker_settings", {"SONIQ_WORKER_DATABASE_URL": url})
        soniq = dict(LEASE_SECONDS=args.lease, HEARTBEAT_SECONDS=args.lease / 4,
                     POLL_INTERVAL=0.5, UNKNOWN_JOB_GRACE_SECONDS=0, RETRY_BASE_SECONDS=0.1,
                     RETRY_MAX_SECONDS=1, IMPORTS=["tests.fleet.jobs"])
        start_python = lambda: python.worker("--queues", "fleet", "--concurrency", "2",  # noqa: E731
                                             **soniq)
        live_nodes = [nodes.start() for _ in range(args.node_workers)]
        live_python = [start_python() for _ in range(args.python_workers)]
        events = (["node_kill"] * args.kills + ["node_stop"] * args.stops
                  + ["python_kill"] * args.python_kills + ["terminate"] * args.terminates)
        rng.shuffle(events)
        tally: Counter = Counter()
        started = time.monotonic()
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                left = lambda: conn.execute(  # noqa: E731
                    "SELECT count(*) FROM soniq_jobs WHERE status <> 'done'").fetchone()[0]
                while events and left():
                    time.sleep(rng.uniform(1, 4))
                    event = events.pop()
                    tally[event] += 1
                    if event == "node_kill":
                        victim = live_nodes.pop(rng.randrange(len(live_nodes)))
                        victim.signal(signal.SIGKILL)
                        live_nodes.append(nodes.start())
                    elif event == "node_stop":
                        victim = _holding_a_claim(conn, live_nodes) or rng.choice(live_nodes)
                        victim.signal(signal.SIGSTOP)
                        time.sleep(3 * args.lease)
                        victim.signal(signal.SIGCONT)
                    elif event == "python_kill":
                        victim = live_python.pop(rng.randrange(len(live_python)))
                        victim.signal(signal.SIGKILL)
                        live_python.append(start_python())
                    else:
                        tally["backends_terminated"] += len(conn.execute(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE application_name = %s AND datname = current_database() "
                            "ORDER BY random() LIMIT 3",
                            [APP_NAME]).fetchall())
                deadline = time.monotonic() + args.timeout
                while left() and time.monotonic() < deadline:
                    time.sleep(1)
            drained = time.monotonic() - started
        finally:
            for child in [*live_nodes, *live_python]:
                if child.alive:
                    child.signal(signal.SIGTERM)
            exits = [child.wait(60) for child in [*live_nodes, *live_python]]
            nodes.cleanup()
            python.cleanup()
        facts = check(url)
    node_events = Counter(event["event"] for worker in nodes.started for event in worker.events())
    facts.update({
        "seconds": round(drained, 1), "faults": dict(tally), "clean_exits": exits.count(0),
        "workers_at_the_end": len(exits),
        "node_events": {name: node_events[name] for name in (
            "completed", "refused", "failed", "deferred", "rerun", "settled",
            "recovered-claim", "retry")},
        "python_job_not_found": sum(child.count("job_not_found") for child in python.children),
    })
    print(json.dumps(facts, indent=2, sort_keys=True))
    clean = (facts["done"] == facts["jobs"] == args.jobs and facts["dead_letters"] == 0
             and facts["jobs_without_one_effect"] == 0
             and facts["effects_of_a_stale_generation"] == 0
             and facts["node_only_run_by_python"] == 0 and facts["python_job_not_found"] == 0
             and facts["clean_exits"] == facts["workers_at_the_end"])
    print("CLEAN" if clean else "NOT CLEAN", f"(logs in {folder})")
    return 0 if clean else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fleet.chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--node-only", type=int, default=600)
    parser.add_argument("--node-workers", type=int, default=3)
    parser.add_argument("--python-workers", type=int, default=2)
    parser.add_argument("--kills", type=int, default=6, help="SIGKILLs of Node workers")
    parser.add_argument("--stops", type=int, default=3, help="SIGSTOPs of Node workers")
    parser.add_argument("--python-kills", type=int, default=3)
    parser.add_argument("--terminates", type=int, default=8)
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=32)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (ClusterUnavailable, NodeUnavailable) as error:
        print(f"fleet chaos cannot run: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

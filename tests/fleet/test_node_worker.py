"""The reference Node worker (contrib/node-worker/) in the suite, beside soniq_worker.

It logs in as a fresh role that has ``soniq_grant --worker`` and INSERT on the
test's own effect table, nothing else. Alone, it claims, completes inside its
own transaction, fails with a retry, hears a cancel, gives back a job it has
no handler for, and signs off. In a mixed fleet -- one soniq_worker, Node
workers, a shared queue, a job name only the Node workers know -- one Node
worker is SIGSTOPped past its lease and another SIGKILLed, and the backends
of the Node workers are terminated while they run: nothing is lost, nothing
reaches the dead letters, every effect is written exactly once, by the claim
that completed the job, and every late completion is refused.
"""

import io
import random
import signal
import time
import uuid
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection

from soniq_django import enqueue
from soniq_django.models import DeadLetterJob, Job, Worker as WorkerRow
from soniq_django.owned import OwnedJobSource
from tests.support.ci import unavailable
from tests.support.node import NodeUnavailable, NodeWorkers
from tests.support.sql import Roles, fetch, raw
from tests.support.worker_processes import Children, database_url
from tests.support.workers import wait_until

# A program in another language on the SQL protocol: run in the Django 5.2 passes only.
pytestmark = [pytest.mark.postgresql_only, pytest.mark.django_db(transaction=True),
              pytest.mark.version_independent]

HANDLERS = Path(__file__).with_name("node_handlers.js")
LEASE = 2  # seconds, for every worker of these tests
APP_NAME = "soniq-node-fleet"  # the Node workers' backends, which a test may terminate


@pytest.fixture
def effects():
    """The application's own table the handlers write; nobody but the test owns it."""
    with raw() as admin:
        admin.execute("CREATE TABLE fleet_effects (job_id uuid NOT NULL, generation bigint "
                      "NOT NULL, runner text NOT NULL)")
    yield
    with raw() as admin:
        admin.execute("DROP TABLE fleet_effects")


@pytest.fixture
def node_role(effects):
    """A fresh role with the worker grant and INSERT on fleet_effects: what a team would give."""
    roles = Roles()
    role = roles.create("soniq_node")
    call_command("soniq_grant", role, "--worker", stdout=io.StringIO())
    with raw() as admin:
        admin.execute(f'GRANT INSERT ON fleet_effects TO "{role}"')
    yield roles.url(role) + f"?application_name={APP_NAME}"
    roles.drop_all()


@pytest.fixture
def node(tmp_path, node_role):
    try:
        # Polling faster than the soniq_worker's 0.5 s, the Node workers win most races
        # for the Node-only jobs it gave back (each give-back delays the job 5 to 30 s).
        workers = NodeWorkers(tmp_path, node_role, HANDLERS, queues="fleet",
                              lease_seconds=LEASE, heartbeat_seconds=0.5, poll_interval=0.2)
    except NodeUnavailable as error:
        unavailable(str(error))
    yield workers
    workers.cleanup()


def worker_id(child) -> str:
    started = wait_until(lambda: child.events("started") or child.exited(), 30,
                         "the Node worker to start")
    return started[0]["worker"]


def statuses(ids) -> Counter:
    return Counter(Job.objects.filter(id__in=ids).values_list("status", flat=True))


def effects_by_job() -> dict:
    rows = fetch("SELECT job_id::text, generation, runner FROM fleet_effects")
    found: dict = {}
    for job_id, generation, runner in rows:
        found.setdefault(job_id, []).append((generation, runner))
    return found


def assert_exactly_once(ids) -> None:
    """One effect per done job, written by the claim that completed it (its generation)."""
    written = effects_by_job()
    for row in Job.objects.filter(id__in=ids):
        assert row.status == "done", (row.id, row.status, row.last_error)
        assert [generation for generation, _ in written.get(str(row.id), [])] == [
            row.claim_generation], row.id
    assert set(written) <= {str(i) for i in ids}


def test_a_node_worker_with_the_worker_grant_alone_runs_the_protocol(node):
    effect = [enqueue("fleet.effect", {"ms": 20}, queue="fleet") for _ in range(5)]
    flaky = enqueue("fleet.flaky", {}, queue="fleet")
    only = enqueue("fleet.node_only", {"ms": 20}, queue="fleet")
    slow = enqueue("fleet.slow", {}, queue="fleet")
    stranger = enqueue("fleet.nobody_knows", {}, queue="fleet")
    child = node.start()
    wid = worker_id(child)
    row = WorkerRow.objects.get(id=wid)
    assert (row.version, row.status, row.queues, row.pid) == (
        "soniq node worker 1.0", "active", ["fleet"], child.pid)
    wait_until(lambda: Job.objects.filter(id=slow, status="processing").exists()
               or child.exited(), 30, "the slow job to start")
    assert OwnedJobSource().request_cancel(slow)
    done = [*effect, flaky, only]
    wait_until(lambda: statuses(done)["done"] == len(done)
               and Job.objects.get(id=slow).status == "cancelled" or child.exited(),
               60, "the Node worker's jobs")
    assert_exactly_once([*effect, only])
    flaky_row = Job.objects.get(id=flaky)
    assert (flaky_row.attempts, flaky_row.result) == (2, {"attempts": 2})
    assert Job.objects.get(id=only).worker_id == uuid.UUID(wid)  # the worker_id rule
    # The job no handler here knows was given back without spending an attempt.
    wait_until(lambda: child.events("deferred") or child.exited(), 30, "a deferral")
    assert Job.objects.get(id=stranger).attempts == 0
    child.signal(signal.SIGTERM)
    assert child.wait(30) == 0
    assert WorkerRow.objects.get(id=wid).status == "stopped"
    assert not child.events("retry") and "worker failed" not in child.log()


def test_a_handler_statement_past_its_own_timeout_is_the_runs_failure(node):
    """57014 (or 55P03) from the handler's own statement is its failure, recorded with an
    attempt spent: not an outcome to settle and a transaction to run again, which a handler
    whose statement always times out would do forever, under the same claim."""
    job = enqueue("fleet.timeout_once", {}, queue="fleet")
    child = node.start()
    wait_until(lambda: statuses([job])["done"] == 1 or child.exited(), 30, "the job done")
    child.signal(signal.SIGTERM)
    assert child.wait(30) == 0
    row = Job.objects.get(id=job)
    assert row.attempts == 2 and "statement timeout" in row.last_error
    assert len(child.events("failed")) == 1 and not child.events("rerun")
    assert_exactly_once([job])


def unfinished(ids) -> list:
    return list(Job.objects.filter(id__in=ids).exclude(status="done").values_list(
        "id", "job_name", "status", "claim_owner", "claim_generation", "attempts",
        "lease_expires_at", "scheduled_at", "last_error"))


def holding(wid: str) -> list[tuple[str, int]]:
    return [(str(job), generation) for job, generation in Job.objects.filter(
        status="processing", claim_owner=wid).values_list("id", "claim_generation")]


def test_a_mixed_fleet_loses_nothing_to_kills_stops_and_broken_connections(node, tmp_path):
    rng = random.Random(32)
    shared = [enqueue("fleet.effect", {"ms": rng.randint(100, 300)}, queue="fleet")
              for _ in range(40)]
    # Each soniq_worker that claims one gives it back for 5 s, then 10, 20, 30
    # (decision 0033): a handful keeps the test short and still crosses both kinds.
    node_only = [enqueue("fleet.node_only", {"ms": rng.randint(100, 300)}, queue="fleet")
                 for _ in range(4)]
    python = Children(tmp_path, database_url(connection))
    try:
        py = python.worker("--queues", "fleet", "--concurrency", "2", LEASE_SECONDS=LEASE,
                           HEARTBEAT_SECONDS=0.5, POLL_INTERVAL=0.5, UNKNOWN_JOB_GRACE_SECONDS=0,
                           IMPORTS=["tests.fleet.jobs"])
        stopped, killed = node.start(), node.start()
        stopped_id, killed_id = worker_id(stopped), worker_id(killed)

        # SIGKILL one Node worker mid-run; a new one takes its place.
        wait_until(lambda: holding(killed_id) or killed.exited(), 60, "a claim to kill")
        killed.signal(signal.SIGKILL)
        lost = holding(killed_id)
        replacement = node.start()

        # A second wave, then SIGSTOP another mid-run, for three leases.
        shared += [enqueue("fleet.effect", {"ms": rng.randint(100, 300)}, queue="fleet")
                   for _ in range(30)]
        held = []
        while not held:  # stopped while it holds a claim (between two, try again)
            wait_until(lambda: holding(stopped_id) or stopped.exited(), 60, "a claim to stop on")
            stopped.signal(signal.SIGSTOP)
            held = holding(stopped_id)
            if not held:
                stopped.signal(signal.SIGCONT)
        time.sleep(3 * LEASE)
        stopped.signal(signal.SIGCONT)

        # Terminate the Node workers' backends a few times while they run.
        terminated = 0
        for _ in range(8):
            time.sleep(0.4)
            terminated += len(fetch(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = %s AND pid <> pg_backend_pid() "
                "AND datname = current_database() ORDER BY random() LIMIT 1", [APP_NAME]))

        everything = shared + node_only
        try:
            wait_until(lambda: statuses(everything)["done"] == len(everything) or py.exited(),
                       240, "every job of the fleet")
        except AssertionError as error:
            raise AssertionError(f"{error}; not done: {unfinished(everything)}") from None
    finally:
        for child in [*node.started, *python.started]:
            if child.alive:
                child.signal(signal.SIGTERM)
        exits = {child.pid: child.wait(40) for child in [*node.started, *python.started]
                 if child is not killed}
        python.cleanup()

    assert set(exits.values()) == {0}, exits
    assert not DeadLetterJob.objects.exists()
    assert "job_not_found" not in py.log()
    assert_exactly_once(everything)
    runners = {runner for runs in effects_by_job().values() for _, runner in runs}
    assert runners == {"node", "python"}  # both languages ran fleet.effect
    written = effects_by_job()
    assert {written[str(job)][0][1] for job in node_only} == {"node"}
    # The stopped worker's claims lapsed and were taken over; each late answer was refused.
    finals = dict(Job.objects.filter(id__in=[j for j, _ in held]).values_list(
        "id", "claim_generation"))
    taken_over = [job for job, generation in held if finals[uuid.UUID(job)]
                  > generation]
    assert taken_over, "the stop should have outlasted a claim"
    refused = {event["job"] for event in stopped.events("refused")}
    assert set(taken_over) <= refused
    assert not stopped.events("completed") or all(
        event["job"] not in taken_over for event in stopped.events("completed"))
    # The killed worker's claims went to other workers.
    for job, generation in lost:
        assert Job.objects.get(id=job).claim_generation > generation
    # The broken connections were lived through (the checks above hold after them).
    assert terminated >= 4


@contextmanager
def through_a_proxy(tmp_path, node_role, poll_interval: float):
    """Node workers whose connections go through a Proxy (tests/support/proxy.py)."""
    from tests.support.proxy import Proxy
    from tests.support.sql import conninfo

    info = conninfo()
    with Proxy(info.get("host", "127.0.0.1"), int(info.get("port", 5432))) as proxy:
        url = node_role.replace(f":{info.get('port', 5432)}/", f":{proxy.port}/", 1)
        try:
            workers = NodeWorkers(tmp_path, url, HANDLERS, queues="fleet", lease_seconds=LEASE,
                                  heartbeat_seconds=0.5, poll_interval=poll_interval)
        except NodeUnavailable as error:
            unavailable(str(error))
        try:
            yield proxy, workers
        finally:
            workers.cleanup()


def test_lost_answers_are_recovered_never_guessed(tmp_path, node_role):
    """Answers lost after the server acted: a claim recovered by its nonce, COMMITs settled."""
    with through_a_proxy(tmp_path, node_role, 0.5) as (proxy, workers):
        jobs = [enqueue("fleet.effect", {"ms": 10}, queue="fleet") for _ in range(4)]
        proxy.lose_answers(b"soniq_claim(", times=2)  # its first two claims find a job
        child = workers.start()
        wait_until(lambda: statuses(jobs)["done"] == 4 or child.exited(), 60, "4 jobs")
        proxy.lose_answers(b"COMMIT", times=3)
        jobs += [enqueue("fleet.effect", {"ms": 10}, queue="fleet") for _ in range(8)]
        wait_until(lambda: statuses(jobs)["done"] == 12 or child.exited(), 60, "12 jobs")
        child.signal(signal.SIGTERM)
        assert child.wait(30) == 0
    assert_exactly_once(jobs)
    assert [event["found"] for event in child.events("recovered-claim")] == [1, 1]
    settled = child.events("settled")
    assert [(event["step"], event["outcome"]) for event in settled] == [
        ("commit", "completed")] * 3
    assert not child.events("rerun") and not child.events("refused")


def _node_backend_in_transaction() -> int | None:
    """The client port (at the proxy) of a Node worker's backend idle in its job's transaction."""
    rows = fetch("SELECT client_port FROM pg_stat_activity WHERE application_name = %s "
                 "AND datname = current_database() AND state = 'idle in transaction' "
                 "AND query LIKE 'INSERT INTO fleet_effects%%'",
                 [APP_NAME])
    return rows[0][0] if rows else None


def test_a_commit_lost_in_a_partition_is_settled_within_the_bounds(tmp_path, node_role):
    """The COMMIT of a job's transaction never reaches the server, which keeps the transaction
    open, holding the job's row. The server ends it after a third of the lease (set with the
    completion); meanwhile soniq_claim_outcome's tries give up at their lock bound (55P03)
    and are asked again; then the claim is live, and the transaction runs again, once."""
    with through_a_proxy(tmp_path, node_role, 0.2) as (proxy, workers):
        child = workers.start()
        job = enqueue("fleet.effect", {"ms": 1500}, queue="fleet")
        port = wait_until(lambda: _node_backend_in_transaction() or child.exited(), 30,
                          "the job's transaction")
        assert proxy.lose_next(port, b"COMMIT") is not None
        wait_until(lambda: statuses([job])["done"] == 1 or child.exited(), 30,
                   "the job done after its lost COMMIT")
        child.signal(signal.SIGTERM)
        assert child.wait(30) == 0
    assert_exactly_once([job])
    assert [(event["step"], event["outcome"]) for event in child.events("settled")] == [
        ("commit", "live")]
    assert len(child.events("rerun")) == 1
    # Each try of soniq_claim_outcome gave up at its lock bound while the lost transaction
    # held the row (without the bound, one try waits until the server ends that transaction).
    assert any(event.get("code") == "55P03" and "soniq_claim_outcome" in event.get("sql", "")
               for event in child.events("retry")), child.log()[-2000:]


def _node_heartbeats_waiting() -> int:
    return fetch("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                 "AND datname = current_database() AND state = 'active' "
                 "AND query LIKE 'SELECT soniq_heartbeat(%%'", [APP_NAME])[0][0]


def test_a_held_row_holds_one_heartbeat_of_a_run_at_a_time(node):
    """While another transaction holds a running job's row, the run's beat waits for it at most
    its lock bound (a sixteenth of the lease: 55P03), and is not piled on the worker's pool
    (4 connections) meanwhile; the run goes on when the row is free, within its lease."""
    job = enqueue("fleet.slow", {}, queue="fleet")
    child = node.start()
    wait_until(lambda: Job.objects.filter(id=job, status="processing").exists()
               or child.exited(), 30, "the slow job to start")
    most = 0
    with raw(autocommit=False) as holder:
        holder.execute("SELECT 1 FROM soniq_jobs WHERE id = %s FOR UPDATE", [job])
        deadline = time.monotonic() + 1.2  # at least one beat (LEASE / 3 apart)
        while time.monotonic() < deadline:
            most = max(most, _node_heartbeats_waiting())
            time.sleep(0.05)
        holder.rollback()
    assert most <= 1, most
    assert {event["code"] for event in child.events("beat-failed")} == {"55P03"}, child.log()
    assert OwnedJobSource().request_cancel(job)
    wait_until(lambda: Job.objects.get(id=job).status == "cancelled" or child.exited(), 30,
               "the cancel")
    child.signal(signal.SIGTERM)
    assert child.wait(30) == 0


def test_a_run_never_outlives_its_lease_unknowing_when_the_path_hangs(tmp_path, node_role):
    """Every connection of the worker stops answering (the proxy freezes: sockets open, TCP
    content). Its beats get no answer within their deadline, and once no renewal has been
    answered for a lease, the run is told it is lost (the signal's reason 'lost') while the
    path still hangs, instead of running on past a lease the database ends by its own clock.
    When the path comes back, the worker goes on: the lapsed job is reaped, nothing hangs."""
    with through_a_proxy(tmp_path, node_role, 0.2) as (proxy, workers):
        child = workers.start()
        job = enqueue("fleet.slow", {}, queue="fleet", max_attempts=1)
        wait_until(lambda: Job.objects.filter(id=job, status="processing").exists()
                   or child.exited(), 30, "the slow job to start")
        proxy.freeze()
        frozen = time.monotonic()
        try:
            wait_until(lambda: child.events("refused") or child.exited(), LEASE + 3,
                       "the run told it is lost, the path still frozen")
            told = time.monotonic() - frozen
        finally:
            proxy.thaw()
        assert [event["job"] for event in child.events("refused")] == [str(job)]
        assert told <= LEASE + 1.5, told
        assert any(event["code"] == "no answer" for event in child.events("beat-failed"))
        # The path is back: the lapsed claim is reaped (one attempt: dead-lettered).
        wait_until(lambda: not Job.objects.filter(id=job, status="processing").exists()
                   or child.exited(), 30, "the lapsed job reaped")
        child.signal(signal.SIGTERM)
        assert child.wait(30) == 0

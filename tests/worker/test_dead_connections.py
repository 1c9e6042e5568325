"""A server that stops answering: the worker's calls end within a bound instead of waiting forever.

soniq_django/wire.py and worker/connection.py (decision 0031). Two ways a connection
dies without a word:

- **a silent peer** (a network partition: nothing comes back, not even
  acknowledgements). TCP notices only after its retransmissions, minutes
  to hours. Every connection of a worker has keepalives and
  ``tcp_user_timeout`` chosen from the lease, so a call blocked on a silent
  peer fails within ``dead_peer_seconds()``. Shown with a real partition:
  a client in a network namespace of the test's own, reaching the server
  through a veth pair whose host end the test takes down (root and
  ``ip`` needed);
- **a stalled server** (a stopped backend, a proxy that stopped
  forwarding): the kernel still acknowledges, keepalives are answered, and
  only a client-side deadline helps. Every turn on the worker's shared
  connection is watched; a call still on the wire after ``turn_bound()``
  has its socket shut down. Shown with a proxy that stops forwarding.

PostgreSQL only: SQLite has no network.
"""

import threading
import time

import pytest
from django.db import connection, connections

from soniq_django import enqueue
from soniq_django.models import Job
from soniq_django.worker import Worker
from soniq_django.worker.connection import SharedConnection
from soniq_django.worker.wakeup import Listener
from soniq_django.wire import dead_peer_seconds, tcp_options, tune, turn_bound
from tests.support.partition import Partition
from tests.support.proxy import Proxy
from tests.support.workers import FAST, WorkerThread

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgresql_only]


def _server() -> tuple[str, int]:
    db = connection.settings_dict
    return db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432)


@pytest.fixture
def proxy():
    stalling = Proxy(*_server())
    yield stalling
    stalling.thaw()
    stalling.close()


def _through(proxy: Proxy, shared: SharedConnection) -> None:
    """Make ``shared`` reach the server through ``proxy`` (from its first turn on)."""
    wrapper = tune(connections.create_connection(shared.using))
    wrapper.settings_dict = {**wrapper.settings_dict, "HOST": proxy.address[0],
                             "PORT": proxy.port}
    wrapper.inc_thread_sharing()
    shared._wrapper = wrapper


def _select_one(shared: SharedConnection, outcome: dict, started: float) -> None:
    try:
        with shared.turn(), connections[shared.using].cursor() as cursor:
            cursor.execute("SELECT 1")
        outcome["answer"] = True
    except Exception as error:  # what the blocked call raised once its socket was shut
        outcome["error"] = error
    outcome["after"] = time.monotonic() - started


# The options --------------------------------------------------------------------------


@pytest.mark.django_db(transaction=False)
@pytest.mark.parametrize("lease, window", [(1, 2.0), (4, 2.0), (30, 15.0), (300, 150.0)])
def test_the_tcp_options_find_a_silent_peer_dead_within_half_a_lease(lease, window):
    options = tcp_options(lease)
    assert dead_peer_seconds(lease) == window
    assert options["tcp_user_timeout"] == window * 1000
    probes = (options["keepalives_idle"]
              + options["keepalives_interval"] * options["keepalives_count"])
    assert options["keepalives"] == 1 and window <= probes <= window + 1
    assert turn_bound(lease) == max(lease / 2, 3.0)


@pytest.mark.django_db(transaction=False)
def test_a_projects_own_options_win_and_settings_are_left_alone(settings):
    wrapper = connections.create_connection("default")
    own = {**wrapper.settings_dict.get("OPTIONS", {}), "keepalives_idle": 77}
    wrapper.settings_dict = {**wrapper.settings_dict, "OPTIONS": own}
    tune(wrapper)
    assert wrapper.settings_dict["OPTIONS"]["keepalives_idle"] == 77
    assert wrapper.settings_dict["OPTIONS"]["tcp_user_timeout"] == tcp_options()[
        "tcp_user_timeout"]
    assert "tcp_user_timeout" not in settings.DATABASES["default"].get("OPTIONS", {})
    mine = tune(connections.create_connection("default"))
    assert "tcp_user_timeout" not in settings.DATABASES["default"].get("OPTIONS", {})
    assert mine.settings_dict["OPTIONS"]["keepalives_idle"] == tcp_options()["keepalives_idle"]


def _tcp(raw) -> dict[str, str]:
    """The TCP options a psycopg connection was opened with."""
    return {key: value for key, value in raw.info.get_parameters().items()
            if key in tcp_options()}


def test_the_workers_connections_have_the_options(settings):
    settings.SONIQ = {**FAST, "LEASE_SECONDS": 8}
    expected = {key: str(value) for key, value in tcp_options(8).items()}
    job_id = enqueue("tests.worker.tcp_options")
    worker = Worker(burst=True)
    assert WorkerThread(worker).start().join() == 0
    assert Job.objects.get(id=job_id).result == expected  # a job thread's own, its handler's
    with worker.shared.turn():  # the shared one
        assert _tcp(connections["default"].connection) == expected
    listener = Listener("default", None, threading.Event(), threading.Event())
    raw = listener._new_connection("default")  # the listener's, and its probe's sender
    try:
        assert _tcp(raw) == expected
    finally:
        raw.close()
    aside: dict = {}

    def beat_aside() -> None:  # the heartbeat's second connection, while a turn is held
        with worker.shared.try_turn(0.01) as turn:
            aside["turn"] = turn
            connections["default"].ensure_connection()
            aside["tcp"] = _tcp(connections["default"].connection)
        connections["default"].close()

    with worker.shared.turn():
        thread = threading.Thread(target=beat_aside)
        thread.start()
        thread.join(10)
    assert aside == {"turn": False, "tcp": expected}
    worker.shared.close()


# A stalled server: the turn's watchdog ---------------------------------------------


def test_a_turn_whose_server_stalls_is_ended_within_its_bound(proxy, settings):
    settings.SONIQ = {**FAST, "LEASE_SECONDS": 2}
    bound = turn_bound()
    shared = SharedConnection("default", threading.Event())
    _through(proxy, shared)
    before: dict = {}
    _select_one(shared, before, time.monotonic())
    assert before["answer"]
    proxy.freeze()  # the proxy's kernel still acknowledges: TCP sees nothing wrong
    outcome: dict = {}
    call = threading.Thread(target=_select_one, args=(shared, outcome, time.monotonic()),
                            daemon=True)
    call.start()
    call.join(3 * bound)
    assert not call.is_alive(), "the call was never ended"
    assert "error" in outcome and shared.watchdog.fired == 1
    assert bound <= outcome["after"] < bound + 1.5, outcome
    proxy.thaw()
    after: dict = {}
    _select_one(shared, after, time.monotonic())  # opened again, and answered
    assert after["answer"] and shared.watchdog.fired == 1
    shared.close()


def test_a_claim_whose_answer_a_stall_swallowed_is_recovered_by_its_nonce(proxy, settings):
    # A lease longer than the bound (3 s), as it is by default: the claim is still live
    # when the recovery asks for it under its nonce.
    settings.SONIQ = {**FAST, "LEASE_SECONDS": 6}
    job_id = enqueue("tests.worker.ok")
    worker = Worker(burst=True)
    _through(proxy, worker.shared)
    with worker.shared.turn():  # connected: the claim's call is what meets the stall
        pass
    proxy.freeze(answers_only=True)  # the claim commits; its answer never comes
    threading.Timer(turn_bound() + 0.5, proxy.thaw).start()  # back after the call was ended
    answer = worker.writes.round([], 1)
    assert worker.shared.watchdog.fired == 1
    row = Job.objects.get(id=job_id)
    # Claimed once, and this worker knows it: a stalled call never became a lost claim.
    assert (row.status, row.claim_generation) == ("processing", 1)
    assert ([job.job_id for job in answer.jobs], answer.unknown) == ([job_id], False)
    worker.shared.close()


# A silent peer: keepalives and tcp_user_timeout --------------------------------------


@pytest.fixture
def partition():
    cut = Partition(*_server())
    yield cut
    cut.close()
    with connection.cursor() as cursor:  # the sessions the cut left behind, mid pg_sleep
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       "WHERE application_name = %s", [cut.application_name])


@pytest.mark.parametrize("tuned", [True, False], ids=["with the options", "without"])
def test_a_call_blocked_on_a_silent_peer_fails_within_half_a_lease(partition, tuned):
    lease = 4.0
    client = partition.client(lease=lease, tuned=tuned)
    client.wait_for_line("blocked", timeout=20)
    time.sleep(0.5)  # the query is on the server, acknowledged: only keepalives can tell now
    partition.cut()
    started = time.monotonic()
    bound = 3 * dead_peer_seconds(lease)  # well past when the options find the peer dead
    ended = client.wait_for_line("failed", timeout=bound)
    elapsed = time.monotonic() - started
    if tuned:
        assert ended, client.log()[-2000:]
        assert elapsed < dead_peer_seconds(lease) + 2.5, elapsed
    else:  # the kernel's own timeouts: about 15 minutes of retransmissions
        assert not ended, client.log()[-2000:]


def test_a_worker_notices_a_partition_within_a_lease_and_carries_on_after_it(partition):
    lease = 4.0
    worker = partition.start(["manage.py", "soniq_worker", "--queues", "partitioned"],
                             LEASE_SECONDS=lease, HEARTBEAT_SECONDS=0.5, POLL_INTERVAL=0.2)
    assert worker.wait_for_line_containing("listening for new jobs", 30), worker.log()[-3000:]
    partition.cut()
    # Its heartbeat's next call meets the silent peer; so does the listener's connection.
    assert worker.wait_for_line_containing("cannot connect to the database", 3 * lease), \
        worker.log()[-3000:]
    assert worker.wait_for_line_containing("listener lost its connection", 3 * lease), \
        worker.log()[-3000:]
    partition.heal()
    job_id = enqueue("tests.worker.ok", queue="partitioned")
    deadline = time.monotonic() + 30
    while Job.objects.get(id=job_id).status != "done" and time.monotonic() < deadline:
        time.sleep(0.1)
    row = Job.objects.get(id=job_id)
    assert (row.status, row.claim_generation) == ("done", 1), worker.log()[-3000:]
    assert worker.wait_for_line_containing("connected to the database after waiting", 5)

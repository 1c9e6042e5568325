"""Prometheus metrics: the queue-level query, the view, and real worker processes scraped.

The series and their labels are the ones docs/metrics.md lists
(``DOCUMENTED`` below is checked against that page). A worker process runs
``manage.py soniq_worker --metrics-port 0`` (a free port, which its log
names) against the test database; this test scrapes it over HTTP and reads
its textfile, and parses both with prometheus_client's own parser.
"""

import datetime as dt
import re
import signal
import urllib.request
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from soniq_django import enqueue, signals
from soniq_django.metrics import QueueCollector, process, read_queues, view
from soniq_django.metrics.labels import OTHER, FirstSeen, max_queues
from soniq_django.models import DeadLetterJob, Job
from soniq_django.owned import OwnedJobSource
from soniq_django.worker import Worker
from tests.support.owned import nonce, rewrite
from tests.support.workers import WorkerThread, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[1]
FAST = {"RETRY_BASE_SECONDS": 0, "LEASE_SECONDS": 5, "HEARTBEAT_SECONDS": 0.2,
        "POLL_INTERVAL": 0.2}

QUEUE_SERIES = {"soniq_queue_metrics_up", "soniq_queue_metrics_query_seconds",
                "soniq_queue_metrics_age_seconds",
                "soniq_queue_jobs", "soniq_queue_due_jobs",
                "soniq_queue_oldest_due_job_age_seconds", "soniq_queue_lapsed_leases",
                "soniq_queue_dead_letters"}
PROCESS_SERIES = {"soniq_jobs_enqueued", "soniq_jobs_started", "soniq_jobs_finished",
                  "soniq_job_duration_seconds", "soniq_job_retries", "soniq_jobs_dead_lettered",
                  "soniq_completions_refused", "soniq_lease_lapses", "soniq_worker_heartbeats"}
WORKER_SERIES = {"soniq_worker_jobs_in_flight", "soniq_worker_concurrency"}
DOCUMENTED = QUEUE_SERIES | PROCESS_SERIES | WORKER_SERIES


@pytest.fixture(autouse=True)
def fresh_metrics(monkeypatch):
    """Each test its own view registries (so no read is served from another test's cache) and
    its own first-seen label sets (so the suite's other queues do not fill them)."""
    monkeypatch.setattr(view, "_registries", {})
    monkeypatch.setattr(process, "queue_label", FirstSeen(max_queues))
    monkeypatch.setattr(process, "worker_label", FirstSeen(lambda: 16))


def parse(text: str) -> dict[str, object]:
    """{family name: family} of an exposition (counters are named without ``_total``)."""
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(families: dict, sample: str, **labels) -> float | None:
    """The value of the sample named ``sample`` with exactly ``labels``; None if absent."""
    for family in families.values():
        for found in family.samples:
            if found.name == sample and found.labels == labels:
                return found.value
    return None


def test_every_series_is_documented_with_its_labels():
    page = (ROOT / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"^\| `(soniq_[a-z_]+)`", page, flags=re.M))
    assert documented == {name + ("_total" if name in PROCESS_SERIES - {
        "soniq_job_duration_seconds"} else "") for name in DOCUMENTED}


# The queue-level query ------------------------------------------------------------


def _queues_fixture() -> dict[str, object]:
    """Rows of every kind the query counts, in queues "mail" and "bill"."""
    now = timezone.now()
    waited = enqueue("tests.add", {"a": 1}, queue="mail")
    rewrite(waited, created_at=now - dt.timedelta(seconds=100))
    enqueue("tests.add", {"a": 2}, queue="mail")
    enqueue("tests.add", {"a": 3}, queue="mail", run_at=now + dt.timedelta(hours=1))
    source = OwnedJobSource()
    enqueue("tests.add", {"a": 4}, queue="bill")
    enqueue("tests.add", {"a": 5}, queue="bill")
    lapsed = source.claim_next_owned("w-1", claim_token=nonce(), queues=["bill"])
    dead = source.claim_next_owned("w-1", claim_token=nonce(), queues=["bill"])
    assert source.fail_owned(dead.claim_fence, "no", retry=False)
    enqueue("tests.add", {"a": 6}, queue="bill")
    done = source.claim_next_owned("w-1", claim_token=nonce(), queues=["bill"])
    assert source.complete_owned(done.claim_fence, 1)
    # Last: a later claim's reaper would settle it.
    rewrite(lapsed.job_id, lease_expires_at=now - dt.timedelta(seconds=5))
    return {"waited": waited}


def test_one_query_reads_depth_due_jobs_oldest_wait_lapsed_leases_and_dead_letters(
        django_assert_num_queries):
    _queues_fixture()
    with django_assert_num_queries(1):
        figures = read_queues("default")
    assert figures.queues == ["bill", "mail"]
    assert figures.jobs == {("mail", "queued"): 3, ("bill", "processing"): 1,
                            ("bill", "done"): 1}
    assert figures.due == {"mail": 2, "bill": 0}
    assert 100 <= figures.oldest_due_age("mail") < 160
    assert figures.oldest_due_age("bill") == 0.0
    assert figures.lapsed_leases == {"mail": 0, "bill": 1}
    assert figures.dead_letters == {("bill", "permanent_failure"): 1}
    assert DeadLetterJob.objects.count() == 1


def test_the_queue_collector_reports_every_status_of_every_queue():
    _queues_fixture()
    registry = CollectorRegistry()
    registry.register(QueueCollector("default"))
    families = parse(generate_latest(registry).decode())
    assert value(families, "soniq_queue_metrics_up") == 1
    for status, count in {"queued": 0, "processing": 1, "done": 1, "cancelled": 0}.items():
        assert value(families, "soniq_queue_jobs", queue="bill", status=status) == count
    assert value(families, "soniq_queue_jobs", queue="mail", status="queued") == 3
    assert value(families, "soniq_queue_due_jobs", queue="mail") == 2
    assert value(families, "soniq_queue_oldest_due_job_age_seconds", queue="mail") >= 100
    assert value(families, "soniq_queue_lapsed_leases", queue="bill") == 1
    assert value(families, "soniq_queue_dead_letters", queue="bill",
                 reason="permanent_failure") == 1


def test_a_failing_query_reports_up_0_instead_of_failing_the_scrape(caplog):
    registry = CollectorRegistry()
    registry.register(QueueCollector("default"))
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE soniq_dead_letter_jobs RENAME TO soniq_dead_letter_gone")
    try:
        families = parse(generate_latest(registry).decode())
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE soniq_dead_letter_gone RENAME TO soniq_dead_letter_jobs")
    assert value(families, "soniq_queue_metrics_up") == 0
    assert "soniq_queue_jobs" not in families
    assert "queue metrics: the query on database 'default' failed" in caplog.text


# The view ------------------------------------------------------------------------------


@pytest.fixture
def metrics_urls(settings):
    settings.ROOT_URLCONF = "tests.testapp.metrics_urls"


@pytest.fixture
def open_metrics(settings, metrics_urls):
    """The view routed, and open to anyone (``METRICS_ACCESS = "open"``)."""
    settings.SONIQ = {"METRICS_ACCESS": "open"}


def test_the_view_serves_the_queue_series_and_this_processs_counters(client, open_metrics):
    _queues_fixture()
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    families = parse(response.content.decode())
    assert QUEUE_SERIES | PROCESS_SERIES <= set(families)
    assert value(families, "soniq_queue_jobs", queue="mail", status="queued") == 3
    assert value(families, "soniq_jobs_enqueued_total", queue="mail") >= 3  # this process's
    assert client.post("/metrics").status_code == 405


def test_the_view_speaks_openmetrics_when_asked(client, open_metrics):
    response = client.get("/metrics", HTTP_ACCEPT="application/openmetrics-text; version=1.0.0")
    assert response["Content-Type"].startswith("application/openmetrics-text")
    assert response.content.decode().rstrip().endswith("# EOF")


def test_a_live_server_answers_a_scrape_over_http(live_server, open_metrics):
    enqueue("tests.add", {"a": 1}, queue="live")
    with urllib.request.urlopen(f"{live_server.url}/metrics", timeout=10) as answer:
        families = parse(answer.read().decode())
    assert value(families, "soniq_queue_jobs", queue="live", status="queued") == 1


# Who may read the view (METRICS_ACCESS), its cost (METRICS_CACHE_SECONDS), its labels -----


TOKEN = "tok-0123456789abcdef-secret"


def test_by_default_only_staff_who_may_view_jobs_read_the_view(
        client, metrics_urls, django_user_model, django_assert_num_queries):
    from django.contrib.auth.models import Permission

    enqueue("tests.add", {"a": 1}, queue="mail")
    with django_assert_num_queries(0):  # refused before any query
        response = client.get("/metrics")
    assert response.status_code == 403 and b"soniq_queue" not in response.content
    assert "no-store" in response["Cache-Control"]
    user = django_user_model.objects.create_user("staff", is_staff=True)
    client.force_login(user)
    assert client.get("/metrics").status_code == 403
    user.user_permissions.set(Permission.objects.filter(codename="view_job"))
    client.force_login(django_user_model.objects.get(pk=user.pk))
    response = client.get("/metrics")
    assert response.status_code == 200
    assert value(parse(response.content.decode()), "soniq_queue_jobs", queue="mail",
                 status="queued") == 1
    user.is_active = False
    user.save()  # Django's backend no longer reads the session as this user's
    assert client.get("/metrics").status_code == 403


def test_with_a_token_only_its_bearer_reads_the_view(client, metrics_urls, settings,
                                                     django_user_model):
    settings.SONIQ = {"METRICS_ACCESS": "token", "METRICS_TOKEN": TOKEN}
    for header in (None, f"Bearer {TOKEN[:-1]}", f"Basic {TOKEN}", TOKEN, f"Bearer {TOKEN}x"):
        extra = {} if header is None else {"HTTP_AUTHORIZATION": header}
        response = client.get("/metrics", **extra)
        assert response.status_code == 401, header
        assert response["WWW-Authenticate"] == 'Bearer realm="soniq metrics"'
        assert TOKEN not in response.content.decode()
    for header in (f"Bearer {TOKEN}", f"bearer {TOKEN}"):
        assert client.get("/metrics", HTTP_AUTHORIZATION=header).status_code == 200
    # A superuser's session is not the token.
    client.force_login(django_user_model.objects.create_superuser("root", "r@x.org", None))
    assert client.get("/metrics").status_code == 401


def test_open_lets_anyone_read_the_view(client, open_metrics):
    assert client.get("/metrics").status_code == 200


@pytest.mark.parametrize(("soniq", "message"), [
    ({"METRICS_ACCESS": "public"}, "SONIQ['METRICS_ACCESS'] must be"),
    ({"METRICS_ACCESS": "token"}, "SONIQ['METRICS_TOKEN'] must be a string of at least 16"),
    ({"METRICS_ACCESS": "token", "METRICS_TOKEN": "short-secret"},
     "SONIQ['METRICS_TOKEN'] must be a string of at least 16"),
    ({"METRICS_TOKEN": 12345678901234567}, "SONIQ['METRICS_TOKEN'] must be"),
    ({"METRICS_CACHE_SECONDS": -1}, "SONIQ['METRICS_CACHE_SECONDS'] must be"),
    ({"METRICS_MAX_QUEUES": 0}, "SONIQ['METRICS_MAX_QUEUES'] must be"),
])
def test_bad_metrics_settings_are_reported_by_the_checks(settings, soniq, message):
    from django.core import checks

    settings.SONIQ = soniq
    found = [m for m in checks.run_checks() if m.id == "soniq.E003"]
    assert len(found) == 1 and found[0].msg.startswith(message), found
    assert "short-secret" not in found[0].msg


def test_scrapes_within_the_cache_time_share_one_read(client, open_metrics, settings,
                                                      django_assert_num_queries):
    settings.SONIQ = {"METRICS_ACCESS": "open", "METRICS_CACHE_SECONDS": 3600}
    enqueue("tests.add", {"a": 1}, queue="mail")
    with django_assert_num_queries(1):
        first = [parse(client.get("/metrics").content.decode()) for _ in range(5)]
    enqueue("tests.add", {"a": 2}, queue="mail")
    with django_assert_num_queries(0):
        again = parse(client.get("/metrics").content.decode())
    for families in (*first, again):
        assert value(families, "soniq_queue_jobs", queue="mail", status="queued") == 1
    assert value(again, "soniq_queue_metrics_age_seconds") >= 0
    settings.SONIQ = {"METRICS_ACCESS": "open", "METRICS_CACHE_SECONDS": 0}
    with django_assert_num_queries(2):
        for _ in range(2):
            families = parse(client.get("/metrics").content.decode())
    assert value(families, "soniq_queue_jobs", queue="mail", status="queued") == 2
    assert value(families, "soniq_queue_metrics_age_seconds") < 5


def test_the_queue_series_label_at_most_max_queues_and_sum_the_rest(settings):
    settings.SONIQ = {"METRICS_MAX_QUEUES": 2, "METRICS_CACHE_SECONDS": 0}
    for queue in ("a", "b", "c", "d"):
        enqueue("tests.add", {"a": 1}, queue=queue)
    rewrite(enqueue("tests.add", {"a": 1}, queue="d"),
            created_at=timezone.now() - dt.timedelta(seconds=500))
    source = OwnedJobSource()
    assert source.fail_owned(source.claim_next_owned("w", claim_token=nonce(),
                                                     queues=["c"]).claim_fence, "x", retry=False)
    rewrite_reason = DeadLetterJob.objects.filter(queue="c")
    rewrite_reason.update(dead_letter_reason="made_up_by_another_worker")
    registry = CollectorRegistry()
    registry.register(QueueCollector("default"))
    families = parse(generate_latest(registry).decode())
    queues = {sample.labels["queue"] for sample in families["soniq_queue_jobs"].samples}
    assert queues == {"a", "b", OTHER}
    # c's one job is dead-lettered; d has two queued.
    assert value(families, "soniq_queue_jobs", queue=OTHER, status="queued") == 2
    assert value(families, "soniq_queue_due_jobs", queue=OTHER) == 2
    assert value(families, "soniq_queue_oldest_due_job_age_seconds", queue=OTHER) >= 500
    assert value(families, "soniq_queue_dead_letters", queue=OTHER, reason="other") == 1


def test_a_processs_counters_label_the_first_queues_and_sum_the_rest(monkeypatch):
    monkeypatch.setattr(process, "queue_label", FirstSeen(lambda: 1))
    before = {queue: _sample("soniq_jobs_enqueued_total", queue=queue)
              for queue in ("first", "second", "third", OTHER)}
    for queue in ("first", "second", "third", "first"):
        enqueue("tests.add", {"a": 1}, queue=queue)
    after = {queue: _sample("soniq_jobs_enqueued_total", queue=queue) - before[queue]
             for queue in before}
    assert after == {"first": 2, "second": 0, "third": 0, OTHER: 2}
    limited = FirstSeen(lambda: 2)
    assert [limited(v) for v in ("x", "y", "z", "x", "y", "w")] == ["x", "y", OTHER, "x", "y",
                                                                      OTHER]


# The counters, fed by the signals ---------------------------------------------------------


def _sample(name: str, **labels) -> float:
    registry = CollectorRegistry()
    for collector in process.process_collectors():
        registry.register(collector)
    return registry.get_sample_value(name, labels) or 0.0


def test_a_refused_completion_and_a_lost_lease_are_counted(settings, run_log):
    # As tests/test_signals.py provokes them: a changed claim token under a running job
    # (heartbeats far apart), then a lapsed lease under another one.
    settings.SONIQ = {**FAST, "LEASE_SECONDS": 60, "HEARTBEAT_SECONDS": 30}
    refused, lapses = (_sample("soniq_completions_refused_total", queue="stale"),
                       _sample("soniq_lease_lapses_total", queue="stale"))
    job_id = enqueue("tests.worker.sleep", {"seconds": 1.0}, queue="stale")
    with WorkerThread(Worker(max_jobs=1, queues=["stale"])) as running:
        run_log.wait_for("start", job_id)
        rewrite(job_id, claim_token="b" * 32)
        wait_until(lambda: _sample("soniq_completions_refused_total", queue="stale") > refused,
                   10, "the refusal to be counted")
        assert running.stop() == 0
    settings.SONIQ = dict(FAST)
    job_id = enqueue("tests.worker.cooperative", {"seconds": 60}, queue="stale")
    with WorkerThread(Worker(max_jobs=1, queues=["stale"])) as running:
        run_log.wait_for("start", job_id)
        rewrite(job_id, lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
        wait_until(lambda: _sample("soniq_lease_lapses_total", queue="stale") > lapses, 10,
                   "the lapse to be counted")
        assert running.stop() == 0
    assert _sample("soniq_completions_refused_total", queue="stale") == refused + 1
    assert _sample("soniq_lease_lapses_total", queue="stale") == lapses + 1
    assert signals.job_refused.receivers  # importing soniq_django.metrics connected them


# A real worker process ----------------------------------------------------------------------


def _port(child) -> int:
    line = wait_until(lambda: re.search(r"metrics: serving http://[^:]+:(\d+)/metrics",
                                        child.log()), 60, "the metrics port in the log")
    return int(line[1])


def _scrape(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return parse(answer.read().decode())


def test_a_running_worker_serves_the_documented_series_with_their_values(children, run_log,
                                                                        tmp_path):
    textfile = tmp_path / "soniq.prom"
    ids = [enqueue("tests.worker.ok", {"n": n}) for n in range(3)]
    ids.append(enqueue("tests.worker.flaky", {"fail_times": 1}))  # a retry, then done
    ids.append(enqueue("tests.worker.permanent"))  # dead: permanent_failure
    ids.append(enqueue("tests.worker.always_fails", max_attempts=1))  # dead: max_retries
    worker_id = "00000000-0000-4000-8000-00000000beef"
    child = children.start("soniq_worker", "--concurrency", "2", "--worker-id", worker_id,
                           "--metrics-port", "0", "--metrics-addr", "127.0.0.1",
                           "--metrics-queues", "--metrics-textfile", str(textfile), **FAST,
                           METRICS_CACHE_SECONDS=0)  # each scrape reads the database
    port = _port(child)
    wait_until(lambda: Job.objects.filter(status="done").count() == 4
               and DeadLetterJob.objects.count() == 2, 60, "the six jobs to end")
    families = wait_until(
        lambda: (lambda found: found if value(found, "soniq_jobs_finished_total",
                                              queue="default", outcome="dead") == 2 else None)(
            _scrape(port)), 20, "the last outcome to be counted")
    assert DOCUMENTED <= set(families), DOCUMENTED - set(families)
    finished = {outcome: value(families, "soniq_jobs_finished_total", queue="default",
                               outcome=outcome) for outcome in ("done", "retry", "dead")}
    assert finished == {"done": 4, "retry": 1, "dead": 2}
    assert value(families, "soniq_jobs_started_total", queue="default") == 7
    assert value(families, "soniq_job_retries_total", queue="default") == 1
    assert value(families, "soniq_jobs_dead_lettered_total", queue="default",
                 reason="permanent_failure") == 1
    assert value(families, "soniq_jobs_dead_lettered_total", queue="default",
                 reason="max_retries_exceeded") == 1
    assert value(families, "soniq_job_duration_seconds_count", queue="default") == 7
    assert value(families, "soniq_job_duration_seconds_bucket", queue="default",
                 le="+Inf") == 7
    assert value(families, "soniq_worker_concurrency", worker_id=worker_id) == 2
    wait_until(lambda: value(_scrape(port), "soniq_worker_heartbeats_total",
                             worker_id=worker_id), 10, "a heartbeat to be counted")
    assert value(families, "soniq_jobs_enqueued_total", queue="default") is None  # not its own
    # The queue-level series, from the database (--metrics-queues).
    assert value(families, "soniq_queue_metrics_up") == 1
    assert value(families, "soniq_queue_jobs", queue="default", status="done") == 4
    assert value(families, "soniq_queue_dead_letters", queue="default",
                 reason="permanent_failure") == 1

    # A job in flight: the worker's gauge and the database's processing count say so.
    running = enqueue("tests.worker.sleep", {"seconds": 3.0})
    run_log.wait_for("start", running)
    families = _scrape(port)
    assert value(families, "soniq_worker_jobs_in_flight", worker_id=worker_id) == 1
    assert value(families, "soniq_queue_jobs", queue="default", status="processing") == 1

    # The textfile: the same process and worker series, rewritten at each heartbeat.
    # A file written before the sleep started can say one in flight too (the
    # fourth ok job's): the one to read also counts four done.
    written = wait_until(
        lambda: (lambda found: found if value(found, "soniq_worker_jobs_in_flight",
                                              worker_id=worker_id) == 1
                 and value(found, "soniq_jobs_finished_total", queue="default",
                           outcome="done") == 4 else None)(parse(textfile.read_text())),
        10, "a heartbeat's textfile with the sleep in flight")
    assert PROCESS_SERIES | WORKER_SERIES <= set(written)
    assert not QUEUE_SERIES & set(written)  # never a query from the heartbeat thread

    child.signal(signal.SIGTERM)
    assert child.wait(30) == 0
    last = parse(textfile.read_text())  # written once more at exit
    assert value(last, "soniq_jobs_finished_total", queue="default", outcome="done") == 5
    assert value(last, "soniq_worker_jobs_in_flight", worker_id=worker_id) == 0
    assert not list(tmp_path.glob("soniq.prom.*"))  # no temporary file left behind


def test_the_command_refuses_metrics_options_without_a_port():
    from django.core.management import call_command
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="need --metrics-port"):
        call_command("soniq_worker", burst=True, metrics_queues=True)
    with pytest.raises(CommandError, match="from 0 to 65535"):
        call_command("soniq_worker", burst=True, metrics_port=70000)


def test_the_command_refuses_a_port_it_cannot_listen_on():
    import socket

    from django.core.management import call_command
    from django.core.management.base import CommandError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError, match=f"--metrics-port {port}: cannot listen"):
            call_command("soniq_worker", burst=True, metrics_port=port,
                         metrics_addr="127.0.0.1")

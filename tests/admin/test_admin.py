"""The admin and its dashboard, through the test client, on both databases.

Rows are made by the real services (enqueue, owned claims, fail → dead
letter), so the pages see what production sees. Actions are checked for
the service they call and for the change they make in the database.
"""

import datetime as dt
import re
import uuid
from dataclasses import dataclass
from unittest import mock

import pytest
from django.contrib.admin import AdminSite
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from soniq_django import bulk_enqueue, enqueue, operations, overview, replay
from soniq_django.admin import JobAdmin, add_dashboard, register_task_registry
from soniq_django.admin.registry import registration_url
from soniq_django.producer.request import JobRequest
from soniq_django.models import (
    DeadLetterJob,
    Job,
    RecurringJob,
    TaskRegistration,
    Worker,
)
from soniq_django.owned import OwnedJobSource
from soniq_django.throughput import ThroughputCounter, minute_of
from tests.support.owned import nonce, rewrite

pytestmark = pytest.mark.django_db

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "billing/jobs.py", line 12, in charge\n'
    'ValueError: card declined <script>alert("x")</script>'
)
MODELS = ("job", "deadletterjob", "recurringjob", "worker", "taskregistration")


@dataclass(frozen=True)
class Rows:
    queued: uuid.UUID
    later: uuid.UUID
    running: uuid.UUID
    done: uuid.UUID
    cancelled: uuid.UUID
    dead: uuid.UUID


def _claim(queue: str):
    return OwnedJobSource().claim_next_owned("worker-a", claim_token=nonce(), queues=[queue])


@pytest.fixture
def rows() -> Rows:
    """One job in each state, and a dead letter, each in its own queue."""
    source = OwnedJobSource()
    queued = enqueue("shop.send_receipt", {"order": 1, "note": "<b>bold</b>"}, queue="mail",
                     dedup_key="receipt-1")
    later = enqueue("shop.reminder", {"order": 1}, queue="later",
                    run_at=timezone.now() + dt.timedelta(hours=1))
    running = enqueue("reports.build", {"day": "2024-01-01"}, queue="reports")
    assert _claim("reports").job_id == running
    done = enqueue("reports.export", {"day": "2024-01-02"}, queue="exports")
    assert source.complete_owned(_claim("exports").claim_fence, {"rows": 3, "html": "<i>x</i>"})
    cancelled = enqueue("shop.send_receipt", {"order": 2}, queue="mail")
    assert operations.cancel_jobs([cancelled]).cancelled == 1
    dead = enqueue("billing.charge", {"amount": 5}, queue="billing")
    assert source.fail_owned(_claim("billing").claim_fence, TRACEBACK, retry=False)
    worker = Worker.objects.create(hostname="host-a", pid=4242, queues=["mail", "reports"],
                                   concurrency=4, version="soniq_django 0.1.0")
    TaskRegistration.objects.create(task_name="shop.send_receipt", worker_id=str(worker.id),
                                    queue="mail", max_attempts=4, unique_job=False,
                                    args_model_repr="Receipt(order: int, note: str = '<b>')")
    # As Soniq 0.1.0's worker writes it: no queue, attempts or unique flag.
    TaskRegistration.objects.create(task_name="shop.send_receipt", worker_id="soniq-run-once")
    RecurringJob.objects.create(job_name="reports.nightly", schedule_type="cron",
                                schedule_value="0 3 * * *")
    return Rows(queued, later, running, done, cancelled, dead)


def _changelist(model: str) -> str:
    return reverse(f"admin:soniq_django_{model}_changelist")


def _change(model: str, pk) -> str:
    return reverse(f"admin:soniq_django_{model}_change", args=[pk])


def _ids(response) -> list:
    return [row.pk for row in response.context["cl"].result_list]


def _act(client, model: str, action: str, ids) -> list[str]:
    """POST an admin action on ``ids``; returns the messages it left."""
    response = client.post(_changelist(model), {
        "action": action, "_selected_action": [str(i) for i in ids], "index": 0,
    })
    assert response.status_code == 302, response.content[:500]
    notes = [str(m) for m in get_messages(response.wsgi_request)]
    client.get(response.url)  # shows (and so clears) the messages, as a browser would
    return notes


def _all_pages(rows: Rows) -> list[str]:
    pages = [reverse("admin:index"), reverse("admin:app_list", args=["soniq_django"]),
             reverse("admin:soniq_django_dashboard")]
    pages += [_changelist(model) for model in MODELS]
    pages += [_change("job", pk) for pk in (rows.queued, rows.later, rows.running, rows.done,
                                            rows.cancelled)]
    pages += [_change("deadletterjob", rows.dead)]
    pages += [_change(model, obj.pk) for model, obj in (
        ("worker", Worker.objects.get()), ("recurringjob", RecurringJob.objects.get()))]
    pages += [registration_url(row) for row in TaskRegistration.objects.all()]
    pages.append(reverse("admin:soniq_django_job_history", args=[rows.running]))
    return pages


# -- pages render, read-only, readable ----------------------------------------

def test_every_changelist_and_detail_page_renders(admin_client, rows):
    for url in _all_pages(rows):
        response = admin_client.get(url)
        assert response.status_code == 200, url


def test_claim_tokens_never_appear_in_any_page(admin_client, rows):
    tokens = [t for t in Job.objects.values_list("claim_token", flat=True) if t]
    assert tokens, "the fixture must hold a live claim"
    for url in _all_pages(rows):
        html = admin_client.get(url).content.decode()
        for token in tokens:
            assert token not in html, url
    # Searching by a token (or part of one) finds nothing: the column is not searched.
    for term in (tokens[0], tokens[0][4:20]):
        assert _ids(admin_client.get(_changelist("job"), {"q": term})) == []


def test_job_detail_shows_json_and_traceback_escaped_in_pre_blocks(admin_client, rows):
    html = admin_client.get(_change("job", rows.queued)).content.decode()
    # Indented JSON (key order is the database's: jsonb sorts keys), escaped, in <pre>.
    pre = re.search(r"<pre[^>]*>(\{\n  &quot;.*?\n\})</pre>", html, re.S)
    assert pre and "&quot;order&quot;: 1" in pre.group(1)
    assert "&quot;note&quot;: &quot;&lt;b&gt;bold&lt;/b&gt;&quot;" in pre.group(1)
    assert "<b>bold</b>" not in html
    done = admin_client.get(_change("job", rows.done)).content.decode()
    assert "&quot;html&quot;: &quot;&lt;i&gt;x&lt;/i&gt;&quot;" in done
    dead = admin_client.get(_change("deadletterjob", rows.dead)).content.decode()
    assert re.search(r"<pre[^>]*>Traceback \(most recent call last\):\n  File", dead)
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in dead
    assert '<script>alert("x")' not in dead


def test_jobs_and_dead_letters_cannot_be_added_edited_or_deleted(admin_client, rows):
    for model, pk in (("job", rows.queued), ("deadletterjob", rows.dead)):
        html = admin_client.get(_change(model, pk)).content.decode()
        assert 'name="_save"' not in html
        assert admin_client.get(reverse(f"admin:soniq_django_{model}_add")).status_code == 403
        assert admin_client.post(_change(model, pk), {"queue": "x"}).status_code == 403
        delete = reverse(f"admin:soniq_django_{model}_delete", args=[pk])
        assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert Job.objects.get(id=rows.queued).queue == "mail"
    assert DeadLetterJob.objects.filter(id=rows.dead).exists()
    html = admin_client.get(_changelist("job")).content.decode()
    assert 'value="delete_selected"' not in html


# -- filters, search, date hierarchy ------------------------------------------

def test_job_filters(admin_client, rows):
    url = _changelist("job")
    assert set(_ids(admin_client.get(url, {"status__exact": "queued"}))) == {
        rows.queued, rows.later}
    assert set(_ids(admin_client.get(url, {"queue": "mail"}))) == {rows.queued, rows.cancelled}
    assert _ids(admin_client.get(url, {"job_name": "reports.build"})) == [rows.running]
    combined = admin_client.get(url, {"job_name": "shop.send_receipt",
                                      "status__exact": "cancelled"})
    assert _ids(combined) == [rows.cancelled]
    this_year = timezone.localtime().year
    assert len(_ids(admin_client.get(url, {"created_at__year": this_year}))) == 5
    assert _ids(admin_client.get(url, {"created_at__year": this_year - 1})) == []


def test_dead_letter_filters(admin_client, rows):
    url = _changelist("deadletterjob")
    assert _ids(admin_client.get(url, {"dead_letter_reason__exact": "permanent_failure"})) == [
        rows.dead]
    assert _ids(admin_client.get(url, {"dead_letter_reason__exact": "job_not_found"})) == []
    assert _ids(admin_client.get(url, {"queue": "billing", "job_name": "billing.charge"})) == [
        rows.dead]
    year = timezone.localtime().year
    assert _ids(admin_client.get(url, {"moved_to_dead_letter_at__year": year})) == [rows.dead]


def test_search_by_id_job_name_and_dedup_key(admin_client, rows):
    url = _changelist("job")
    assert _ids(admin_client.get(url, {"q": str(rows.running)})) == [rows.running]
    assert _ids(admin_client.get(url, {"q": f"  {rows.running.hex.upper()} "})) == [rows.running]
    assert rows.running in _ids(admin_client.get(url, {"q": str(rows.running)[:8]}))
    assert set(_ids(admin_client.get(url, {"q": "send_receipt"}))) == {
        rows.queued, rows.cancelled}
    assert _ids(admin_client.get(url, {"q": "receipt-1"})) == [rows.queued]
    assert _ids(admin_client.get(url, {"q": str(uuid.uuid4())})) == []
    dead = _changelist("deadletterjob")
    assert _ids(admin_client.get(dead, {"q": str(rows.dead)})) == [rows.dead]
    assert _ids(admin_client.get(dead, {"q": "billing"})) == [rows.dead]


# -- actions call the services and do what they say -----------------------------

def test_cancel_action(admin_client, rows):
    with mock.patch.object(operations, "cancel_jobs", wraps=operations.cancel_jobs) as spy:
        notes = _act(admin_client, "job", "cancel_selected",
                     [rows.queued, rows.running, rows.done, rows.cancelled])
    assert set(spy.call_args.args[0]) == {rows.queued, rows.running, rows.done, rows.cancelled}
    assert notes == ["Cancelled 1 job.", "Asked the worker of 1 running job to stop it.",
                     "Nothing to cancel for 2 jobs: they had finished, or are no longer there."]
    assert _act(admin_client, "job", "cancel_selected", [rows.done]) == [
        "Nothing to cancel for 1 job: it had finished, or is no longer there."]
    assert Job.objects.get(id=rows.queued).status == "cancelled"
    running = Job.objects.get(id=rows.running)
    assert running.status == "processing" and running.cancel_requested
    html = admin_client.get(_changelist("job"), {"q": str(rows.running)}).content.decode()
    assert "processing (cancel requested)" in html
    # Asking again is still "asked to stop", not "nothing to cancel".
    assert _act(admin_client, "job", "cancel_selected", [rows.running]) == [
        "Asked the worker of 1 running job to stop it."]


def test_cancel_messages_count_in_the_plural(admin_client, rows):
    more = [enqueue("shop.send_receipt", {"order": n}, queue="mail") for n in (10, 11)]
    assert _act(admin_client, "job", "cancel_selected", [rows.queued, *more]) == [
        "Cancelled 3 jobs."]


def _lapse(job_id) -> None:
    rewrite(job_id, lease_expires_at=timezone.now() - dt.timedelta(minutes=5))


def test_cancelling_a_running_job_whose_lease_lapsed_says_what_the_service_did(admin_client,
                                                                               rows):
    # No live worker is left to see a request: the service cancels it at
    # once, or (older storage code) sets the request. The message says which.
    _lapse(rows.running)
    notes = _act(admin_client, "job", "cancel_selected", [rows.running])
    row = Job.objects.get(id=rows.running)
    if row.status == "cancelled":
        assert notes == ["Cancelled 1 job."]
    else:
        assert (row.status, row.cancel_requested) == ("processing", True)
        assert notes == ["Asked the worker of 1 running job to stop it."]


def _cancel_at_once(self, job_id):
    """request_cancel as it is for a running job whose lease has lapsed: cancelled at once."""
    rewrite(job_id, status="cancelled", lease_expires_at=None, pid=None,
            expires_at=timezone.now() + dt.timedelta(minutes=5), updated_at=timezone.now())
    return True


def _finish_first(self, job_id):
    """The worker completes the job just before the request reaches it."""
    rewrite(job_id, status="done", lease_expires_at=None, pid=None,
            expires_at=timezone.now() + dt.timedelta(minutes=5))
    return False


def _requeued_meanwhile(self, job_id):
    """The worker's attempt failed and the job went back to the queue before the request."""
    rewrite(job_id, status="queued", lease_expires_at=None, pid=None)
    return False


@pytest.mark.parametrize(("service", "note", "status"), [
    (_cancel_at_once, "Cancelled 1 job.", "cancelled"),
    (_finish_first, "Nothing to cancel for 1 job: it had finished, or is no longer there.",
     "done"),
    (_requeued_meanwhile,
     "1 job was not cancelled: its state changed meanwhile. Select it again.", "queued"),
])
def test_cancel_message_follows_the_row_after_the_service_not_the_status_before(
        admin_client, rows, service, note, status):
    # The job was processing when selected; what the service (or a worker)
    # did to it decides the message.
    _lapse(rows.running)
    with mock.patch.object(OwnedJobSource, "request_cancel", service):
        assert _act(admin_client, "job", "cancel_selected", [rows.running]) == [note]
    assert Job.objects.get(id=rows.running).status == status


def test_retry_now_action(admin_client, rows):
    with mock.patch.object(operations, "retry_now_ids", wraps=operations.retry_now_ids) as spy:
        notes = _act(admin_client, "job", "retry_selected_now", [rows.later, rows.queued])
    assert spy.called
    assert notes == ["Made 1 waiting job due now; skipped 1 not queued for later."]
    assert Job.objects.get(id=rows.later).scheduled_at <= timezone.now()


def test_delete_finished_action(admin_client, rows):
    with mock.patch.object(operations, "delete_finished_rows",
                           wraps=operations.delete_finished_rows) as spy:
        notes = _act(admin_client, "job", "delete_selected_finished",
                     [rows.done, rows.cancelled, rows.queued, rows.running])
    assert spy.called
    assert notes == ["Deleted 2 finished jobs; kept 2 that are queued, running or protected "
                     "owned submissions."]
    assert set(Job.objects.values_list("id", flat=True)) == {rows.queued, rows.later,
                                                             rows.running}


def test_replay_action(admin_client, rows):
    with mock.patch.object(replay, "replay_dead_letters",
                           wraps=replay.replay_dead_letters) as spy:
        notes = _act(admin_client, "deadletterjob", "replay_selected", [rows.dead])
    assert spy.call_args.kwargs["ids"] == [rows.dead]
    assert notes == ["Replayed 1 dead letter into the queue."]
    job = Job.objects.get(id=rows.dead)
    assert (job.status, job.attempts, job.args) == ("queued", 0, {"amount": 5})
    assert DeadLetterJob.objects.get(id=rows.dead).resurrection_count == 1
    again = _act(admin_client, "deadletterjob", "replay_selected", [rows.dead])
    assert again == ["Replayed 0 dead letters into the queue. Skipped: 1 already in the queue."]
    assert DeadLetterJob.objects.get(id=rows.dead).resurrection_count == 1
    # Each detail page now links to the other.
    dead_html = admin_client.get(_change("deadletterjob", rows.dead)).content.decode()
    assert _change("job", rows.dead) in dead_html
    assert _change("deadletterjob", rows.dead) in admin_client.get(
        _change("job", rows.dead)).content.decode()


def test_pause_and_resume_actions(admin_client, rows):
    schedule = RecurringJob.objects.get()
    with mock.patch.object(operations, "set_schedule_status_ids",
                           wraps=operations.set_schedule_status_ids) as spy:
        assert _act(admin_client, "recurringjob", "pause_selected", [schedule.id]) == [
            "Paused 1 schedule."]
        assert _act(admin_client, "recurringjob", "pause_selected", [schedule.id]) == [
            "Paused 0 schedules; 1 already paused."]
        assert RecurringJob.objects.get().status == "paused"
        assert _act(admin_client, "recurringjob", "resume_selected", [schedule.id]) == [
            "Resumed 1 schedule."]
    assert [c.args[1] for c in spy.call_args_list] == ["paused", "paused", "active"]
    assert RecurringJob.objects.get().status == "active"


def test_view_only_staff_sees_no_actions_and_cannot_run_them(client, django_user_model, rows):
    user = django_user_model.objects.create_user("viewer", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(
        codename__in=["view_job", "view_deadletterjob"]))
    client.force_login(user)
    response = client.get(_changelist("job"))
    assert response.status_code == 200
    assert "cancel_selected" not in response.content.decode()
    client.post(_changelist("job"), {"action": "cancel_selected",
                                     "_selected_action": [str(rows.queued)], "index": 0})
    assert Job.objects.get(id=rows.queued).status == "queued"
    client.post(_changelist("deadletterjob"), {"action": "replay_selected",
                                               "_selected_action": [str(rows.dead)], "index": 0})
    assert not Job.objects.filter(id=rows.dead).exists()
    assert client.get(reverse("admin:soniq_django_dashboard")).status_code == 200


# -- recurring schedules: add and edit with validation ----------------------------

def _schedule_form(**overrides) -> dict:
    data = {"job_name": "reports.hourly", "schedule_type": "interval", "schedule_value": "3600",
            "job_kwargs": '{"scope": "all"}', "status": "active", "queue": "reports",
            "priority": "100", "max_attempts": "4"}
    return {**data, **overrides}


@pytest.mark.parametrize(("overrides", "field"), [
    ({"schedule_value": "0"}, "schedule_value"),
    ({"schedule_value": "-5"}, "schedule_value"),
    ({"schedule_value": "1.5"}, "schedule_value"),
    ({"schedule_value": "soon"}, "schedule_value"),
    ({"schedule_type": "cron", "schedule_value": "61 * * * *"}, "schedule_value"),
    ({"schedule_type": "cron", "schedule_value": "* * * *"}, "schedule_value"),
    ({"job_kwargs": "[1, 2]"}, "job_kwargs"),
    ({"job_name": "Not A Name"}, "job_name"),
    ({"max_attempts": "0"}, "max_attempts"),
])
def test_recurring_job_form_rejects_what_the_scheduler_could_not_run(admin_client, overrides,
                                                                     field):
    response = admin_client.post(reverse("admin:soniq_django_recurringjob_add"),
                                 _schedule_form(**overrides))
    assert response.status_code == 200
    assert field in response.context["adminform"].form.errors
    assert not RecurringJob.objects.exists()


def test_recurring_job_add_and_edit(admin_client):
    add = admin_client.post(reverse("admin:soniq_django_recurringjob_add"),
                            _schedule_form(schedule_value=" 900 "))
    assert add.status_code == 302
    row = RecurringJob.objects.get()
    assert (row.schedule_value, row.job_kwargs, row.next_run) == ("900", {"scope": "all"}, None)
    # The scheduler fires meanwhile; the edit must not undo its columns.
    fired = timezone.now()
    RecurringJob.objects.filter(id=row.id).update(run_count=7, last_run=fired, next_run=fired)
    edit = admin_client.post(_change("recurringjob", row.id),
                             _schedule_form(schedule_type="cron", schedule_value="*/5  * * * *"))
    assert edit.status_code == 302
    row.refresh_from_db()
    assert (row.schedule_type, row.schedule_value) == ("cron", "*/5 * * * *")
    assert (row.run_count, row.last_run) == (7, fired)
    assert row.next_run is None  # worked out again by the scheduler from the new timing
    # An edit that leaves the timing alone leaves next_run alone too.
    RecurringJob.objects.filter(id=row.id).update(next_run=fired)
    admin_client.post(_change("recurringjob", row.id),
                      _schedule_form(schedule_type="cron", schedule_value="*/5 * * * *",
                                     queue="nightly"))
    row.refresh_from_db()
    assert (row.queue, row.next_run) == ("nightly", fired)


def test_saving_a_schedule_defined_in_code_warns_that_the_scheduler_rewrites_it(admin_client):
    in_code = {"reports.hourly": None}
    with mock.patch("soniq_django.admin.recurring.code_schedules", return_value=in_code):
        response = admin_client.post(reverse("admin:soniq_django_recurringjob_add"),
                                     _schedule_form())
    notes = [str(m) for m in get_messages(response.wsgi_request)]
    assert any("scheduled in code with @periodic" in note for note in notes)


# -- query counts stay flat -----------------------------------------------------

def _count_queries(client, url) -> tuple[int, list[str]]:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == 200
    return len(captured.captured_queries), [q["sql"] for q in captured.captured_queries]


def _add_jobs(count: int, start: int) -> None:
    bulk_enqueue([JobRequest(f"flat.job_{i % 7}", {"n": i, "pad": "x" * 200},
                             queue=f"q{i % 3}", dedup_key=f"flat-{i}")
                  for i in range(start, start + count)])


def _add_dead_letters(count: int) -> None:
    now = timezone.now()
    DeadLetterJob.objects.bulk_create([
        DeadLetterJob(id=uuid.uuid4(), job_name=f"flat.job_{i % 7}", args={"n": i},
                      queue=f"q{i % 3}", dead_letter_reason="permanent_failure",
                      last_error="Traceback ...", moved_to_dead_letter_at=now)
        for i in range(count)
    ])


@pytest.mark.parametrize("query", ["", "?status__exact=queued&q=flat",
                                   f"?created_at__year={dt.date.today().year}"])
def test_job_changelist_queries_do_not_grow_with_rows(admin_client, django_assert_max_num_queries,
                                                      query):
    url = _changelist("job") + query
    _add_jobs(10, 0)
    admin_client.get(url)  # warm caches (content types, session)
    small, _ = _count_queries(admin_client, url)
    _add_jobs(990, 10)
    with django_assert_max_num_queries(small) as captured:
        response = admin_client.get(url)
    assert len(response.context["cl"].result_list) == 50
    listing = [q["sql"] for q in captured.captured_queries
               if 'FROM "soniq_jobs"' in q["sql"] and "LIMIT" in q["sql"]]
    assert listing, "the page query was not seen"
    for sql in listing:
        select_list = sql.split(" FROM ")[0]
        for column in ("args", "result", "last_error", "claim_token", "submission_fingerprint"):
            assert f'"soniq_jobs"."{column}"' not in select_list, column


def _add_registrations(count: int, start: int) -> None:
    TaskRegistration.objects.bulk_create([
        TaskRegistration(task_name=f"flat.job_{i % 7}", worker_id=f"w{i}", queue=f"q{i % 3}",
                         args_model_repr="Args(" + "n: int, " * 50 + ")")
        for i in range(start, start + count)])


def test_dead_letter_worker_registry_and_dashboard_queries_do_not_grow_with_rows(
        admin_client, django_assert_max_num_queries):
    urls = [_changelist("deadletterjob"), _changelist("worker"), _changelist("taskregistration"),
            reverse("admin:soniq_django_dashboard"), reverse("admin:soniq_django_dashboard_live")]
    _add_dead_letters(10)
    _add_jobs(10, 0)
    _add_registrations(10, 0)
    for i in range(3):
        Worker.objects.create(hostname=f"h{i}", pid=i, queues=None)
    small = {}
    for url in urls:
        admin_client.get(url)
        small[url], _ = _count_queries(admin_client, url)
    _add_dead_letters(990)
    _add_jobs(990, 10)
    _add_registrations(290, 10)
    Worker.objects.bulk_create([Worker(hostname=f"h{i}", pid=i) for i in range(3, 300)])
    for url in urls:
        with django_assert_max_num_queries(small[url]) as captured:
            assert admin_client.get(url).status_code == 200
        pages = [q["sql"] for q in captured.captured_queries
                 if 'FROM "soniq_task_registry"' in q["sql"] and "LIMIT" in q["sql"]]
        assert bool(pages) == (url == _changelist("taskregistration")), url
        for sql in pages:
            assert '"args_model_repr"' not in sql.split(" FROM ")[0], sql


# -- the dashboard --------------------------------------------------------------

def test_snapshot_counts_waits_dead_letters_workers_and_throughput(settings):
    settings.SONIQ = {"HEARTBEAT_SECONDS": 30}  # live window: max(3 * 30, 60) = 90 s
    source = OwnedJobSource()
    now = timezone.now()
    old = enqueue("a.job", queue="alpha")
    rewrite(old, created_at=now - dt.timedelta(minutes=30))
    # Due long ago, but enqueued five minutes ago: it has waited five minutes.
    recent = enqueue("a.job", queue="alpha", run_at=now - dt.timedelta(minutes=50))
    rewrite(recent, created_at=now - dt.timedelta(minutes=5))
    enqueue("a.job", queue="alpha", run_at=now + dt.timedelta(hours=2))  # not due: not waiting
    enqueue("b.job", queue="beta")
    assert _claim("beta") is not None
    enqueue("b.job", queue="beta", run_at=now + dt.timedelta(hours=1))
    enqueue("c.job", queue="gamma")
    assert source.fail_owned(_claim("gamma").claim_fence, "boom", retry=False)
    enqueue("c.job", queue="gamma")
    assert source.fail_owned(_claim("gamma").claim_fence, "gone", retry=False,
                             dead_letter_reason="job_not_found")
    enqueue("c.job", queue="gamma")
    assert source.fail_owned(_claim("gamma").claim_fence, "gone", retry=False,
                             dead_letter_reason="job_not_found")
    live = Worker.objects.create(hostname="live-1", pid=1, queues=["alpha"], concurrency=4,
                                 last_heartbeat=now - dt.timedelta(seconds=20),
                                 version="soniq_django 1.0")
    # A Soniq 0.1.0 worker: every queue is an empty list, no version.
    Worker.objects.create(hostname="live-2", pid=2, queues=[], status="stopping",
                          last_heartbeat=now - dt.timedelta(seconds=80))
    silent = Worker.objects.create(hostname="silent", pid=3,
                                   last_heartbeat=now - dt.timedelta(minutes=5))
    Worker.objects.create(hostname="stopped", pid=4, status="stopped", last_heartbeat=now)
    for name, worker_id, queue in (("a.job", live.id, "alpha"), ("a.job", silent.id, "alpha"),
                                   ("a.job", "soniq-run-once", None), ("b.job", silent.id, None)):
        TaskRegistration.objects.create(task_name=name, worker_id=str(worker_id), queue=queue,
                                        last_seen_at=now - dt.timedelta(minutes=1))
    counter = ThroughputCounter()
    for kind, count, ago in (("done", 3, 2), ("failed", 1, 2), ("dead_lettered", 2, 10),
                             ("cancelled", 1, 59), ("done", 5, 70)):
        for _ in range(count):
            counter.add("alpha", kind, now - dt.timedelta(minutes=ago))
    counter.flush("default")

    snap = overview.snapshot("default", now=now)

    table = {row.queue: dict(row.cells) for row in snap.queues}
    assert list(table) == ["alpha", "beta", "gamma"]
    assert table["alpha"] == {"queued": 3, "processing": 0, "done": 0, "cancelled": 0,
                              "dead_letter": 0}
    assert table["beta"] == {"queued": 1, "processing": 1, "done": 0, "cancelled": 0,
                             "dead_letter": 0}
    assert table["gamma"]["dead_letter"] == 3 and sum(table["gamma"].values()) == 3
    assert dict(snap.totals) == {"queued": 4, "processing": 1, "done": 0, "cancelled": 0,
                                 "dead_letter": 3}
    waits = {row.queue: row.oldest_wait for row in snap.queues}
    assert abs(waits["alpha"] - dt.timedelta(minutes=30)) < dt.timedelta(seconds=1)
    assert waits["beta"] is None and waits["gamma"] is None
    assert snap.dead_letters_by_reason == (("job_not_found", 2), ("permanent_failure", 1))
    assert snap.live_window == dt.timedelta(seconds=90)
    assert [(w.hostname, w.queues, w.concurrency) for w in snap.live_workers] == [
        ("live-1", ("alpha",), 4), ("live-2", None, 1)]
    assert [w.version for w in snap.live_workers] == ["soniq_django 1.0", None]
    assert snap.silent_workers == 1
    assert [(t.task_name, t.live_workers, t.workers, t.queue) for t in snap.tasks] == [
        ("a.job", 1, 3, "alpha"), ("b.job", 0, 1, None)]
    assert len(snap.throughput) == 60
    assert snap.throughput[-1].minute == minute_of(now)
    by_minute = {m.minute: m for m in snap.throughput}
    two_ago = by_minute[minute_of(now - dt.timedelta(minutes=2))]
    assert (two_ago.counts["done"], two_ago.counts["failed"], two_ago.total) == (3, 1, 4)
    assert by_minute[minute_of(now - dt.timedelta(minutes=59))].counts["cancelled"] == 1
    assert sum(m.total for m in snap.throughput) == 4 + 2 + 1  # the 70-minute-old row is out


def test_status_counts_live_workers_by_what_runs_them():
    from soniq_django.overview import queue_summary

    now = timezone.now()
    for pid, version in enumerate(["soniq_django 1.0", "soniq_django 1.0", None]):
        Worker.objects.create(hostname="h", pid=pid, version=version, last_heartbeat=now)
    Worker.objects.create(hostname="h", pid=9, status="stopped", version="soniq_django 0.9")
    summary = queue_summary()
    assert summary["live_workers"] == 3
    # Soniq 0.1.0's own workers write no version.
    assert summary["live_workers_by_version"] == {"soniq_django 1.0": 2, "unknown": 1}


def test_live_window_is_three_heartbeats_but_at_least_a_minute(settings):
    settings.SONIQ = {}
    assert overview.live_window() == dt.timedelta(seconds=60)
    settings.SONIQ = {"HEARTBEAT_SECONDS": 45}
    assert overview.live_window() == dt.timedelta(seconds=135)


def test_snapshot_takes_the_same_queries_however_many_rows(django_assert_num_queries):
    # Nine, and on PostgreSQL one more: the database's clock, which ages count from.
    queries = 10 if connection.vendor == "postgresql" else 9
    with django_assert_num_queries(queries):
        overview.snapshot()
    _add_jobs(500, 0)
    _add_dead_letters(200)
    Worker.objects.bulk_create([Worker(hostname=f"h{i}", pid=i) for i in range(50)])
    TaskRegistration.objects.bulk_create([
        TaskRegistration(task_name=f"t.n{i % 7}", worker_id=f"w{i}") for i in range(200)])
    with django_assert_num_queries(queries):
        overview.snapshot()


def test_chart_geometry():
    start = minute_of(timezone.now()) - dt.timedelta(minutes=59)
    minutes = tuple(overview.MinuteCount(start + dt.timedelta(minutes=i), {})
                    for i in range(60))
    empty = overview.chart(minutes)
    assert empty.empty and empty.peak == 4 and all(not bar.segments for bar in empty.bars)
    minutes = minutes[:30] + (overview.MinuteCount(minutes[30].minute, {
        "done": 6, "failed": 2, "dead_lettered": 1, "cancelled": 0}),) + minutes[31:]
    chart = overview.chart(minutes, width=720, height=220)
    assert not chart.empty and chart.peak == 20 and len(chart.bars) == 60
    bar = chart.bars[30]
    assert [s.kind for s in bar.segments] == ["done", "failed", "dead_lettered"]
    heights = [s.height for s in bar.segments]
    assert heights == pytest.approx([chart.plot_height * n / 20 for n in (6, 2, 1)], abs=0.01)
    assert bar.segments[0].y + bar.segments[0].height == pytest.approx(chart.bottom)
    assert bar.segments[1].y + bar.segments[1].height == pytest.approx(bar.segments[0].y)
    assert [t.label for t in chart.y_ticks] == ["0", "5", "10", "15", "20"]
    assert [t.label for t in chart.x_ticks][0] == timezone.localtime(start).strftime("%H:%M")
    assert len(chart.x_ticks) == 7  # every ten minutes, and the last one
    assert all(chart.left <= b.x and b.x + b.width <= chart.right for b in chart.bars)
    assert "done 6, failed 2, dead lettered 1, cancelled 0" in bar.title


@pytest.mark.parametrize(("value", "ceiling"), [(0, 4), (4, 4), (5, 8), (9, 20), (21, 40),
                                                (81, 200), (1999, 2000)])
def test_chart_axis_tops_divide_into_whole_quarters(value, ceiling):
    assert overview._nice_ceiling(value) == ceiling
    assert ceiling % 4 == 0


def test_duration_text():
    assert [overview.duration_text(dt.timedelta(seconds=s)) for s in (5, 192, 7500, 273600)] == [
        "5 s", "3 min 12 s", "2 h 5 min", "3 d 4 h"]


def test_dashboard_page(admin_client, rows):
    counter = ThroughputCounter()
    counter.add("mail", "done")
    counter.flush("default")
    response = admin_client.get(reverse("admin:soniq_django_dashboard"))
    assert response.status_code == 200
    assert response.context["site_header"]  # rendered with the admin site's context
    html = response.content.decode()
    assert "<svg" in html and 'class="seg-done"' in html
    assert "No job finished in the last hour." not in html
    assert f'{_changelist("job")}?queue=mail&amp;status__exact=queued">1</a>' in html
    assert f'{_changelist("deadletterjob")}?dead_letter_reason__exact=permanent_failure' in html
    assert "host-a" in html and "4242" in html and "mail, reports" in html
    assert "soniq_django 0.1.0" in html
    tasks = html.split('id="soniq-tasks"')[1].split("</table>")[0]
    # One job name over two registry rows: ours (live worker) and one Soniq wrote.
    registry = f'{_changelist("taskregistration")}?task_name=shop.send_receipt'
    assert re.search(r'<a href="' + re.escape(registry) + r'">shop\.send_receipt</a></th>\s*'
                     r"<td>mail</td>\s*<td class=\"num\">4</td>\s*"
                     r"<td class=\"num\">1</td>\s*<td class=\"num\">2</td>", tasks), tasks
    # Drawn on the server; the one script of its own is a static file (no inline code,
    # so a CSP of script-src 'self' allows it), and no asset comes from another site.
    scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", html, re.S)
    assert all(not body.strip() and ' src="/static/' in attrs for attrs, body in scripts), scripts
    assert any("soniq_django/dashboard.js" in attrs for attrs, _ in scripts)
    assert "<script" not in html.split('<div id="soniq-dashboard"')[1]
    assert not re.search(r'(src|href)="(https?:)?//', html)


def test_a_workers_page_lists_the_job_names_it_registered(admin_client, rows):
    worker = Worker.objects.get()
    html = admin_client.get(_change("worker", worker.pk)).content.decode()
    row = TaskRegistration.objects.get(worker_id=str(worker.id))
    assert f'<a href="{registration_url(row)}">shop.send_receipt</a> (mail)' in html
    assert "soniq_django 0.1.0" in html


# -- the task registry: read-only, keyed by (job name, worker id) ------------------

def test_registry_list_filters_and_search(admin_client, rows):
    worker = Worker.objects.get()
    TaskRegistration.objects.create(task_name="reports.build", worker_id=str(worker.id),
                                    queue="reports", max_attempts=2)
    url = _changelist("taskregistration")

    def listed(params=None):
        response = admin_client.get(url, params or {})
        assert response.status_code == 200
        return [(row.task_name, row.worker_id) for row in response.context["cl"].result_list]

    ours, soniqs = ("shop.send_receipt", str(worker.id)), ("shop.send_receipt", "soniq-run-once")
    assert listed() == [("reports.build", str(worker.id)), ours, soniqs]
    assert listed({"task_name": "shop.send_receipt"}) == [ours, soniqs]
    assert listed({"queue": "mail"}) == [ours]
    assert listed({"queue__isnull": "True"}) == [soniqs]
    assert listed({"q": "run-once"}) == [soniqs]
    assert listed({"q": "reports"}) == [("reports.build", str(worker.id))]
    html = admin_client.get(url).content.decode()
    for row in TaskRegistration.objects.all():
        assert f'href="{registration_url(row)}"' in html
    # No actions, so no row checkboxes (they would need a one-column key).
    assert 'name="_selected_action"' not in html and 'name="action"' not in html
    # Facet counts would COUNT a two-column key: not offered.
    assert "_facets" not in html
    assert admin_client.get(url, {"_facets": "True"}).status_code == 200


def test_a_registry_rows_page_is_read_only_and_shows_its_repr_escaped(admin_client, rows):
    worker = Worker.objects.get()
    ours = TaskRegistration.objects.get(worker_id=str(worker.id))
    response = admin_client.get(registration_url(ours))
    assert response.status_code == 200
    html = response.content.decode()
    assert re.search(r"<pre[^>]*>Receipt\(order: int, note: str = &#x27;&lt;b&gt;&#x27;\)</pre>",
                     html), html
    assert f'href="{_change("worker", worker.id)}"' in html  # the worker that registered it
    assert 'name="_save"' not in html and "/history/" not in html
    soniqs = admin_client.get(registration_url(TaskRegistration.objects.get(
        worker_id="soniq-run-once"))).content.decode()
    assert "soniq-run-once" in soniqs and "<a href" not in soniqs.split("soniq-run-once")[0][-40:]
    # Nothing can be added, changed or deleted.
    assert admin_client.get(reverse("admin:soniq_django_taskregistration_add")).status_code == 403
    assert admin_client.post(registration_url(ours), {"queue": "x"}).status_code == 403
    key = registration_url(ours).split("/")[-3]
    delete = reverse("admin:soniq_django_taskregistration_delete", args=[key])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert TaskRegistration.objects.get(worker_id=str(worker.id)).queue == "mail"
    # A key that names no row, or is not a key at all, is "not found", not an error.
    for missing in ('["no.such", "w"]', "garbage", '["one"]'):
        gone = reverse("admin:soniq_django_taskregistration_change", args=[missing])
        assert admin_client.get(gone).status_code == 302


def test_registry_needs_its_view_permission(client, django_user_model, rows):
    user = django_user_model.objects.create_user("viewer", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename="view_job"))
    client.force_login(user)
    url = _changelist("taskregistration")
    assert client.get(url).status_code == 403
    user.user_permissions.add(Permission.objects.get(codename="view_taskregistration"))
    assert client.get(url).status_code == 200
    index = client.get(reverse("admin:app_list", args=["soniq_django"])).content.decode()
    assert f'href="{url}"' in index and "Registered tasks" in index


def test_register_task_registry_serves_it_on_a_custom_admin_site(rf, django_user_model, rows):
    # Django's register() refuses a composite primary key outright; soniq
    # registers the registry's admin itself, once however often it is asked.
    from django.core.exceptions import ImproperlyConfigured

    assert TaskRegistration._meta.is_composite_pk
    site = AdminSite(name="ops")
    with pytest.raises(ImproperlyConfigured, match="composite primary key"):
        site.register(TaskRegistration)
    register_task_registry(site)
    first = site.get_model_admin(TaskRegistration)
    register_task_registry(site)
    assert site.get_model_admin(TaskRegistration) is first
    request = rf.get("/ops/soniq_django/taskregistration/")
    request.user = django_user_model.objects.create_superuser("root", "r@example.com", None)
    response = first.changelist_view(request)
    assert response.status_code == 200
    assert len(response.context_data["cl"].result_list) == 2


def test_workers_filter_by_every_queue_or_named_queues(admin_client):
    Worker.objects.create(hostname="every-soniq", pid=1, queues=[])
    Worker.objects.create(hostname="every-null", pid=2, queues=None)
    Worker.objects.create(hostname="named", pid=3, queues=["mail"])

    def hosts(value):
        response = admin_client.get(_changelist("worker") + f"?serves={value}")
        return sorted(worker.hostname for worker in response.context["cl"].result_list)

    assert hosts("all") == ["every-null", "every-soniq"]
    assert hosts("some") == ["named"]


def test_dashboard_is_linked_from_the_app_index_and_the_jobs_list(admin_client):
    dashboard_url = reverse("admin:soniq_django_dashboard")
    assert dashboard_url == "/admin/soniq_django/dashboard/"
    for page in (reverse("admin:app_list", args=["soniq_django"]), _changelist("job")):
        assert f'href="{dashboard_url}"' in admin_client.get(page).content.decode(), page


def test_add_dashboard_serves_it_on_a_custom_admin_site(rf, django_user_model):
    site = AdminSite(name="ops")
    site.register(Job, JobAdmin)
    add_dashboard(site)
    add_dashboard(site)  # twice is harmless
    patterns = [p for p in site.get_urls() if getattr(p, "name", None) == "soniq_django_dashboard"]
    assert len(patterns) == 1 and str(patterns[0].pattern) == "soniq_django/dashboard/"
    request = rf.get("/ops/soniq_django/dashboard/")
    request.user = django_user_model.objects.create_superuser("root", "r@example.com", None)
    response = patterns[0].callback(request)
    assert response.status_code == 200
    assert response.context_data["snapshot"].queues == ()


def test_dashboard_needs_the_view_job_permission(client, django_user_model):
    user = django_user_model.objects.create_user("staff", is_staff=True)
    client.force_login(user)
    assert client.get(reverse("admin:soniq_django_dashboard")).status_code == 403


def test_non_staff_are_sent_to_the_login_page(client, django_user_model, rows):
    user = django_user_model.objects.create_user("visitor")
    client.force_login(user)
    for url in _all_pages(rows):
        response = client.get(url)
        assert response.status_code == 302, url
        assert response.url.startswith(reverse("admin:login")), url

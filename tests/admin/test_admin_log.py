"""Every operator action of the admin is in Django's admin log (LogEntry), with who did it.

On both databases. Each action must write exactly one entry per row it
changed -- the user, the row's content type and id, CHANGE (DELETION for a
delete), a message saying what happened -- and none for a row it left
alone. A replayed dead letter is logged on the job it became (same id).
"""

import datetime as dt
import uuid

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.contrib.messages import get_messages
from django.db import connections
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from soniq_django import enqueue, flow, operations
from soniq_django.admin import DeadLetterJobAdmin, JobAdmin
from soniq_django.models import Job, QueueSetting, RecurringJob
from soniq_django.owned import OwnedJobSource
from tests.support.owned import nonce

pytestmark = pytest.mark.django_db

SECRET_ARG = "s3cr3t-card-4242"  # in every job's args: never in the log


@pytest.fixture
def admin_user(django_user_model):
    return django_user_model.objects.create_superuser("night-operator", "op@example.com",
                                                      password=None)


@pytest.fixture
def admin_client(client, admin_user):
    client.force_login(admin_user)
    return client


def _claim(queue: str):
    return OwnedJobSource().claim_next_owned("w", claim_token=nonce(), queues=[queue])


def _dead(queue: str, count: int) -> list:
    source, ids = OwnedJobSource(), []
    for i in range(count):
        ids.append(enqueue("billing.charge", {"n": i, "card": SECRET_ARG}, queue=queue))
        assert source.fail_owned(_claim(queue).claim_fence, "ValueError: no", retry=False)
    return ids


def _act(client, model: str, action: str, ids) -> list[str]:
    response = client.post(reverse(f"admin:soniq_django_{model}_changelist"), {
        "action": action, "_selected_action": [str(i) for i in ids], "index": 0,
    })
    assert response.status_code == 302, response.content[:500]
    notes = [str(m) for m in get_messages(response.wsgi_request)]
    client.get(response.url)  # shows (and so clears) the messages, as a browser would
    return notes


def _matching(client, model: str, operation: str, query: str = "") -> list[str]:
    url = reverse(f"admin:soniq_django_{model}_matching", args=[operation]) + query
    response = client.post(url)
    assert response.status_code == 302, response.content[:500]
    notes = [str(m) for m in get_messages(response.wsgi_request)]
    client.get(response.url)  # shows (and so clears) the messages, as a browser would
    return notes


def _entries(after: int = 0) -> list[tuple]:
    """Every log entry (after id ``after``): (user, model, object id, flag, message)."""
    return sorted(
        (e.user.get_username(), e.content_type.model_class(), e.object_id, e.action_flag,
         e.get_change_message())
        for e in LogEntry.objects.filter(id__gt=after).select_related("user", "content_type"))


def _last_id() -> int:
    return LogEntry.objects.order_by("-id").values_list("id", flat=True).first() or 0


def _expected(model, ids, flag, message, user="night-operator") -> list[tuple]:
    return sorted((user, model, str(i), flag, message) for i in ids)


def _no_args_in_the_log() -> None:
    for repr_, message in LogEntry.objects.values_list("object_repr", "change_message"):
        assert SECRET_ARG not in repr_ and SECRET_ARG not in message


def _again_logs_nothing(client, model: str, action: str, ids) -> list[str]:
    """The same action once more: nothing left to change, nothing logged; its messages."""
    mark = _last_id()
    notes = _act(client, model, action, ids)
    assert _entries(mark) == []
    _no_args_in_the_log()
    return notes


def test_cancel_logs_the_cancelled_and_the_newly_asked_only(admin_client):
    queued = enqueue("shop.send", {"card": SECRET_ARG}, queue="mail")
    running = enqueue("reports.build", {"card": SECRET_ARG}, queue="reports")
    assert _claim("reports").job_id == running
    done = enqueue("reports.export", queue="exports")
    assert OwnedJobSource().complete_owned(_claim("exports").claim_fence, 1)
    _act(admin_client, "job", "cancel_selected", [queued, running, done, uuid.uuid4()])
    assert _entries() == sorted([
        ("night-operator", Job, str(queued), CHANGE, "Cancelled from the admin."),
        ("night-operator", Job, str(running), CHANGE,
         "Cancel requested from the admin: its worker was asked to stop it."),
    ])
    entry = LogEntry.objects.get(object_id=str(queued))
    assert entry.object_repr == "shop.send (cancelled)"
    assert entry.content_type == ContentType.objects.get_for_model(Job)
    # Again: the queued one is cancelled, the running one already asked: nothing changes.
    notes = _again_logs_nothing(admin_client, "job", "cancel_selected", [queued, running])
    assert "Asked the worker of 1 running job to stop it." in notes


def test_retry_now_logs_only_the_jobs_it_made_due(admin_client):
    later = timezone.now() + dt.timedelta(hours=1)
    waiting = [enqueue("shop.remind", {"n": n, "card": SECRET_ARG}, queue="later", run_at=later)
               for n in range(2)]
    due = enqueue("shop.remind", {"n": 9}, queue="later")
    _act(admin_client, "job", "retry_selected_now", [*waiting, due])
    assert _entries() == _expected(Job, waiting, CHANGE, "Made due now from the admin.")
    assert _again_logs_nothing(admin_client, "job", "retry_selected_now", waiting) == [
        "Made 0 waiting jobs due now; skipped 2 not queued for later."]


def test_delete_logs_a_deletion_per_deleted_job_and_none_for_the_kept(admin_client):
    done = enqueue("reports.export", {"card": SECRET_ARG}, queue="exports")
    assert OwnedJobSource().complete_owned(_claim("exports").claim_fence, 1)
    cancelled = enqueue("shop.send", queue="mail")
    assert operations.cancel_jobs([cancelled]).cancelled == 1
    queued = enqueue("shop.send", queue="mail")
    _act(admin_client, "job", "delete_selected_finished", [done, cancelled, queued])
    assert _entries() == _expected(Job, [done, cancelled], DELETION,
                                   "Deleted from the admin (a finished job).")
    assert LogEntry.objects.get(object_id=str(done)).object_repr == "reports.export (done)"
    _again_logs_nothing(admin_client, "job", "delete_selected_finished", [queued])


def test_replay_logs_on_the_job_each_dead_letter_became(admin_client):
    dead = _dead("billing", 2)
    _act(admin_client, "deadletterjob", "replay_selected", dead)
    assert _entries() == _expected(Job, dead, CHANGE, "Replayed from the admin.")
    assert {e.object_repr for e in LogEntry.objects.all()} == {"billing.charge (queued)"}
    # The job's page links to its History page, which lists it.
    history_url = reverse("admin:soniq_django_job_history", args=[dead[0]])
    page = admin_client.get(reverse("admin:soniq_django_job_change", args=[dead[0]]))
    assert history_url in page.content.decode()
    history = admin_client.get(history_url)
    assert history.status_code == 200
    assert "Replayed from the admin." in history.content.decode()
    assert _again_logs_nothing(admin_client, "deadletterjob", "replay_selected", dead) == [
        "Replayed 0 dead letters into the queue. Skipped: 2 already in the queue."]


def test_pause_and_resume_selected_queues_log_the_queues_that_changed(admin_client):
    for name in ("mail", "billing"):
        QueueSetting.objects.create(queue=name, updated_at=timezone.now())
    flow.pause_queue("billing")
    _act(admin_client, "queuesetting", "pause_selected", ["mail", "billing"])
    assert _entries() == _expected(QueueSetting, ["mail"], CHANGE,
                                   "Paused the queue from the admin.")
    mark = _last_id()
    _act(admin_client, "queuesetting", "resume_selected", ["mail", "billing"])
    assert _entries(mark) == _expected(QueueSetting, ["mail", "billing"], CHANGE,
                                       "Resumed the queue from the admin.")
    _again_logs_nothing(admin_client, "queuesetting", "resume_selected", ["mail"])


def test_pause_and_resume_selected_schedules_log_the_schedules_that_changed(admin_client):
    nightly, hourly = (RecurringJob.objects.create(
        job_name=name, schedule_type="cron", schedule_value="0 3 * * *",
        job_kwargs={"card": SECRET_ARG}) for name in ("reports.nightly", "reports.hourly"))
    operations.set_schedule_status([hourly.id], "paused")
    _act(admin_client, "recurringjob", "pause_selected", [nightly.id, hourly.id])
    assert _entries() == _expected(RecurringJob, [nightly.id], CHANGE,
                                   "Paused the schedule from the admin.")
    assert LogEntry.objects.get().object_repr == "reports.nightly (cron 0 3 * * *)"
    mark = _last_id()
    _act(admin_client, "recurringjob", "resume_selected", [nightly.id, hourly.id])
    assert _entries(mark) == _expected(RecurringJob, [nightly.id, hourly.id], CHANGE,
                                       "Resumed the schedule from the admin.")
    _no_args_in_the_log()


def _log_inserts(queries) -> int:
    return sum(1 for q in queries if q["sql"].lstrip().upper().startswith("INSERT")
               and "django_admin_log" in q["sql"])


def test_replay_all_matching_logs_every_row_one_insert_a_batch(admin_client, monkeypatch):
    billing = _dead("billing", 5)
    mail = _dead("mail", 1)
    monkeypatch.setattr(DeadLetterJobAdmin, "matching_batch", 2)
    with CaptureQueriesContext(connections["default"]) as queries:
        notes = _matching(admin_client, "deadletterjob", "replay", "?queue=billing")
    assert notes == ["Replayed 5 dead letters into the queue."]
    assert _entries() == _expected(Job, billing, CHANGE,
                                   "Replayed from the admin (all matching).")
    assert str(mail[0]) not in {e.object_id for e in LogEntry.objects.all()}
    assert _log_inserts(queries.captured_queries) == 3  # batches of 2, 2 and 1
    mark = _last_id()
    _matching(admin_client, "deadletterjob", "replay", "?queue=billing")
    assert _entries(mark) == []  # all already in the queue: nothing changed
    _no_args_in_the_log()


def test_retry_all_matching_logs_only_the_jobs_it_made_due(admin_client, monkeypatch):
    later = timezone.now() + dt.timedelta(hours=1)
    waiting = [enqueue("a.job", {"n": n}, queue="mail", run_at=later) for n in range(5)]
    due = enqueue("a.job", queue="mail")
    other = enqueue("a.job", queue="other", run_at=later)
    monkeypatch.setattr(JobAdmin, "matching_batch", 2)
    with CaptureQueriesContext(connections["default"]) as queries:
        notes = _matching(admin_client, "job", "retry-now", "?queue=mail")
    assert notes == ["Made 5 waiting jobs due now; skipped 1 not queued for later."]
    assert _entries() == _expected(Job, waiting, CHANGE,
                                   "Made due now from the admin (all matching).")
    assert not LogEntry.objects.filter(object_id__in=[str(due), str(other)]).exists()
    # Six jobs in batches of 2: three batches, each changed some, each one insert.
    assert _log_inserts(queries.captured_queries) == 3


def test_the_entries_name_whoever_did_it(client, django_user_model):
    dead = _dead("billing", 2)
    for name, job_id in zip(("alice", "bob"), dead):
        user = django_user_model.objects.create_superuser(name, f"{name}@example.com",
                                                          password=None)
        client.force_login(user)
        _act(client, "deadletterjob", "replay_selected", [job_id])
    assert _entries() == sorted([("alice", Job, str(dead[0]), CHANGE, "Replayed from the admin."),
                                 ("bob", Job, str(dead[1]), CHANGE, "Replayed from the admin.")])


def test_a_changed_row_gone_before_it_is_logged_is_logged_on_its_id(rf, admin_user):
    from soniq_django.admin.base import log_changed

    kept = enqueue("a.job", queue="mail")
    gone = uuid.uuid4()  # say, made due and then deleted before the log read it
    request = rf.post("/")
    request.user = admin_user
    log_changed(request, Job, "default", [kept, gone], "Made due now from the admin.")
    assert _entries() == _expected(Job, [kept, gone], CHANGE, "Made due now from the admin.")
    assert LogEntry.objects.get(object_id=str(kept)).object_repr == "a.job (queued)"

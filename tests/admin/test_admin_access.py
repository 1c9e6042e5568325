"""The dashboard asks the admins it mirrors, and says why due jobs wait (issue 28, items 6 and 10).

Item 10: every part of the dashboard, and its Pause/Resume endpoint, goes
through the ModelAdmin registered on the dashboard's own site
(``has_view_permission``, ``has_change_permission`` with the row,
``has_add_permission`` when a pause would add one), so a restricted or
unregistered admin restricts the dashboard too (403 or 404, never 500); a
user with only "view job" sees no worker host or pid, dead-letter reason,
registered job name or who paused, on the page, in its live JSON or on a
job's timeline. Names with bidi overrides or invisible characters are shown
escaped and marked.

Item 6: the queued jobs split into due, scheduled and retrying; each
queue's limits with what counts against them; what holds due jobs back;
the live workers' slots; the Version column; the Dashboard entry on the
site index and the app index. On both databases.
"""

import datetime as dt

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.urls import reverse
from django.utils import timezone

from soniq_django import enqueue, pause_queue, replay
from soniq_django.models import DeadLetterJob, Job, QueueSetting, TaskRegistration, Worker
from soniq_django.owned import OwnedJobSource
from tests.support.owned import nonce

pytestmark = pytest.mark.django_db

SITES = "tests.admin.sites"


def _user(client, django_user_model, *codenames: str, superuser: bool = False):
    if superuser:
        user = django_user_model.objects.create_superuser("root", "r@example.com", None)
    else:
        user = django_user_model.objects.create_user("staff", is_staff=True)
        user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client.force_login(user)
    return client


def _claim(queue: str, owner: str = "worker-a"):
    return OwnedJobSource().claim_next_owned(owner, claim_token=nonce(), queues=[queue])


def _dead_letter(queue: str = "billing") -> str:
    job_id = enqueue("billing.charge", {"amount": 5}, queue=queue)
    assert OwnedJobSource().fail_owned(_claim(queue).claim_fence,
                                       "ValueError: declined-secret-reason", retry=False)
    return job_id


# -- item 10: the dashboard's Pause/Resume goes through the queue settings admin -------------

@pytest.mark.urls(SITES)
def test_pause_goes_through_the_queue_admins_own_change_permission(client, django_user_model):
    """A superuser on a site whose queue settings admin refuses changes cannot pause either."""
    enqueue("a.job", queue="mail")
    QueueSetting.objects.create(queue="reports")
    root = _user(client, django_user_model, superuser=True)
    page = root.get(reverse("admin:soniq_django_dashboard", current_app="strict"))
    assert page.status_code == 200 and 'name="action"' not in page.content.decode()
    url = reverse("admin:soniq_django_dashboard_queue", current_app="strict")
    assert url == "/strict/soniq_django/dashboard/queue/"
    for queue in ("mail", "reports"):
        for action in ("pause", "resume"):
            assert root.post(url, {"queue": queue, "action": action}).status_code == 403
    assert list(QueueSetting.objects.values_list("queue", "paused")) == [("reports", False)]
    assert not LogEntry.objects.exists()


@pytest.mark.urls(SITES)
def test_without_a_queue_admin_the_dashboard_works_and_pausing_is_not_found(
        client, django_user_model):
    enqueue("a.job", queue="mail")
    _dead_letter()
    TaskRegistration.objects.create(task_name="shop.secret_task", worker_id="w1")
    root = _user(client, django_user_model, superuser=True)
    page = root.get("/jobs-only/soniq_django/dashboard/")
    assert page.status_code == 200  # no link to an admin the site does not have
    html = page.content.decode()
    assert 'name="action"' not in html and "shop.secret_task" not in html
    assert "declined" not in html and "permanent_failure" not in html
    live = root.get("/jobs-only/soniq_django/dashboard/live/")
    assert live.status_code == 200 and "dead_letters_by_reason" not in live.json()["figures"]
    response = root.post("/jobs-only/soniq_django/dashboard/queue/",
                         {"queue": "mail", "action": "pause"})
    assert response.status_code == 404 and not QueueSetting.objects.exists()


@pytest.mark.urls(SITES)
def test_without_a_jobs_admin_the_dashboard_is_not_found(client, django_user_model):
    root = _user(client, django_user_model, superuser=True)
    for path in ("", "live/"):
        assert root.get(f"/no-jobs/soniq_django/dashboard/{path}").status_code == 404
    response = root.post("/no-jobs/soniq_django/dashboard/queue/",
                         {"queue": "mail", "action": "pause"})
    assert response.status_code == 404 and not QueueSetting.objects.exists()


def test_pausing_a_queue_without_a_row_needs_the_add_permission(client, django_user_model):
    enqueue("a.job", queue="mail")
    enqueue("a.job", queue="reports")
    QueueSetting.objects.create(queue="reports")
    changer = _user(client, django_user_model, "view_job", "view_queuesetting",
                    "change_queuesetting")
    page = changer.get(reverse("admin:soniq_django_dashboard")).content.decode()
    mail = page.split('data-queue="mail"')[1].split("</tr>")[0]
    reports = page.split('data-queue="reports"')[1].split("</tr>")[0]
    assert 'value="pause"' not in mail and 'value="pause"' in reports
    url = reverse("admin:soniq_django_dashboard_queue")
    assert changer.post(url, {"queue": "mail", "action": "pause"}).status_code == 403
    assert not QueueSetting.objects.filter(queue="mail").exists()
    assert changer.post(url, {"queue": "reports", "action": "pause"}).status_code == 302
    assert QueueSetting.objects.get(queue="reports").paused
    assert changer.post(url, {"queue": "reports", "action": "resume"}).status_code == 302
    assert not QueueSetting.objects.get(queue="reports").paused
    assert LogEntry.objects.count() == 2


# -- item 10: what a user with only "view job" sees -----------------------------------------

@pytest.fixture
def secrets_on_the_dashboard():
    """A live worker's host and pid, a dead letter's reason, a registered name, who paused."""
    worker = Worker.objects.create(hostname="secret-host-7", pid=48213, queues=["mail"],
                                   concurrency=2)
    TaskRegistration.objects.create(task_name="shop.secret_task", worker_id=str(worker.id),
                                    queue="mail")
    _dead_letter()
    enqueue("a.job", queue="mail")
    pause_queue("mail", by="alice-who-paused")
    return worker


SECRETS = ("secret-host-7", "48213", "permanent_failure", "shop.secret_task", "alice-who-paused")


def test_a_view_job_user_sees_none_of_what_the_other_admins_refuse(
        client, django_user_model, secrets_on_the_dashboard):
    viewer = _user(client, django_user_model, "view_job")
    page = viewer.get(reverse("admin:soniq_django_dashboard"))
    live = viewer.get(reverse("admin:soniq_django_dashboard_live"))
    assert page.status_code == live.status_code == 200
    for text in (page.content.decode(), live.content.decode()):
        for secret in SECRETS:
            assert secret not in text, secret
    figures = live.json()["figures"]
    assert "dead_letters_by_reason" not in figures and "dead_letter" not in figures["totals"]
    assert figures["live_workers"] == 1 and figures["slots"] == 2
    assert set(live.json()["modules"]) == {"soniq-queues", "soniq-throughput", "soniq-workers"}
    assert "1 live worker: 0 of 2 slots in use." in live.json()["modules"]["soniq-workers"]


def test_each_admins_view_permission_shows_its_part(client, django_user_model,
                                                    secrets_on_the_dashboard):
    everything = _user(client, django_user_model, "view_job", "view_worker",
                       "view_deadletterjob", "view_taskregistration", "view_queuesetting")
    text = everything.get(reverse("admin:soniq_django_dashboard")).content.decode()
    for secret in SECRETS:
        assert secret in text, secret
    live = everything.get(reverse("admin:soniq_django_dashboard_live")).json()
    assert live["figures"]["dead_letters_by_reason"] == {"permanent_failure": 1}


def test_a_view_job_user_sees_no_dead_letter_on_a_replayed_jobs_timeline(
        client, django_user_model):
    job_id = _dead_letter()
    assert replay.replay_dead_letters("default", ids=[job_id]).replayed
    url = reverse("admin:soniq_django_job_change", args=[job_id])
    viewer = _user(client, django_user_model, "view_job")
    page = viewer.get(url).content.decode()
    assert "Timeline" in page and "Enqueued" in page
    # The job's own last error is the job's column; the dead letter's record is not shown.
    assert "permanent_failure" not in page and "dead-lettered" not in page.lower()
    assert "Attempt 1: ended, the job left the queue" in page
    assert reverse("admin:soniq_django_deadletterjob_change", args=[job_id]) not in page
    user = django_user_model.objects.get(username="staff")
    user.user_permissions.add(Permission.objects.get(codename="view_deadletterjob"))
    page = viewer.get(url).content.decode()
    assert "permanent_failure" in page and "Attempt 1: dead-lettered" in page
    assert reverse("admin:soniq_django_deadletterjob_change", args=[job_id]) in page


def test_a_workers_page_lists_its_job_names_only_for_who_may_view_the_registry(
        client, django_user_model, secrets_on_the_dashboard):
    url = reverse("admin:soniq_django_worker_change", args=[secrets_on_the_dashboard.id])
    viewer = _user(client, django_user_model, "view_worker")
    assert "shop.secret_task" not in viewer.get(url).content.decode()
    user = django_user_model.objects.get(username="staff")
    user.user_permissions.add(Permission.objects.get(codename="view_taskregistration"))
    assert "shop.secret_task" in viewer.get(url).content.decode()


# -- item 10: names that hide characters ----------------------------------------------------

def test_a_queue_name_with_a_bidi_override_is_shown_escaped_and_marked(admin_client):
    enqueue("a.job", queue="emails")
    enqueue("a.job", queue="sliame\u202e")  # reads "emails" where the override is honoured
    enqueue("a.job", queue="emails\u200b")
    page = admin_client.get(reverse("admin:soniq_django_dashboard")).content.decode()
    # Raw only in what is never drawn: the row's data attribute and the button's form value.
    shown = page.split('data-queue="sliame\u202e"')[1].split("</th>")[0]
    assert "\u202e" not in shown and "sliame<mark" in shown
    assert '<mark title="U+202E RIGHT-TO-LEFT OVERRIDE">\\u202e</mark>' in page
    assert '<mark title="U+200B ZERO WIDTH SPACE">\\u200b</mark>' in page
    assert page.count('class="soniq-marked"') == 2
    jobs = admin_client.get(reverse("admin:soniq_django_job_changelist")).content.decode()
    assert jobs.count('<mark title="U+202E RIGHT-TO-LEFT OVERRIDE">\\u202e</mark>') >= 2
    assert '<mark title="U+200B ZERO WIDTH SPACE">\\u200b</mark>' in jobs
    pause_queue("sliame\u202e")
    for url in (reverse("admin:soniq_django_queuesetting_changelist"),
                reverse("admin:soniq_django_queuesetting_change", args=["sliame\u202e"])):
        page = admin_client.get(url)
        assert page.status_code == 200, url
        assert '<mark title="U+202E RIGHT-TO-LEFT OVERRIDE">' in page.content.decode(), url


# -- item 6: the split, the limits, what holds due jobs back, the slots ----------------------

def _live_queue(client, name: str) -> dict:
    figures = client.get(reverse("admin:soniq_django_dashboard_live")).json()["figures"]
    return {queue["queue"]: queue for queue in figures["queues"]}[name]


def test_queued_jobs_are_split_into_due_scheduled_and_retrying(admin_client):
    enqueue("a.job", queue="mail")
    enqueue("a.job", queue="mail", run_at=timezone.now() - dt.timedelta(seconds=5))  # due
    enqueue("a.job", queue="mail", run_at=dt.timedelta(hours=1))
    enqueue("a.job", queue="mail", run_at=dt.timedelta(hours=2))
    enqueue("a.job", queue="mail", max_attempts=3)
    assert OwnedJobSource().fail_owned(_claim("mail").claim_fence, "boom", retry=True,
                                       retry_delay=600)
    row = _live_queue(admin_client, "mail")
    assert row["counts"]["queued"] == 5
    assert row["queued"] == {"due": 2, "scheduled": 2, "retrying": 1, "waiting": 0}
    page = admin_client.get(reverse("admin:soniq_django_dashboard")).content.decode()
    mail = page.split('data-queue="mail"')[1].split("</tr>")[0]
    assert [mail.split(f'data-status="{key}">')[1].split("</td>")[0].split(">")[-2].split("<")[0]
            for key in ("due", "scheduled", "retrying")] == ["2", "2", "1"]
    for heading in ("Due now", "Scheduled", "Retrying"):
        assert f">{heading}</th>" in page


def test_limits_and_what_holds_due_jobs_back(admin_client):
    worker = Worker.objects.create(hostname="w", pid=1, queues=None, concurrency=8)
    QueueSetting.objects.create(queue="one-at-a-time", concurrency=1)
    QueueSetting.objects.create(queue="api", rate_limit=2, rate_period=3600)
    for queue, jobs in (("one-at-a-time", 2), ("api", 3), ("free", 1)):
        for _ in range(jobs):
            enqueue("a.job", queue=queue)
    assert _claim("one-at-a-time", str(worker.id)) and _claim("api", str(worker.id))
    assert _claim("api", str(worker.id)) and _claim("api", str(worker.id)) is None
    limited = _live_queue(admin_client, "one-at-a-time")
    assert limited["limits"] == {"concurrency": 1, "running": 1, "rate": None, "started": 0}
    assert limited["held_back_by"] == ["concurrency"]
    rated = _live_queue(admin_client, "api")
    assert rated["limits"] == {"concurrency": None, "running": 2, "rate": [2, 3600],
                               "started": 2}
    assert rated["held_back_by"] == ["rate"]
    assert _live_queue(admin_client, "free")["held_back_by"] == []
    pause_queue("free")
    assert _live_queue(admin_client, "free")["held_back_by"] == ["paused"]
    page = admin_client.get(reverse("admin:soniq_django_dashboard")).content.decode()
    row = page.split('data-queue="one-at-a-time"')[1].split("</tr>")[0]
    assert 'class="at-limit"' in row and "1 of 1 running" in row
    assert "at its concurrency limit" in row
    row = page.split('data-queue="api"')[1].split("</tr>")[0]
    assert "2 of 2 started per 3600 s" in row and "at its rate limit" in row
    figures = admin_client.get(reverse("admin:soniq_django_dashboard_live")).json()["figures"]
    assert (figures["slots"], figures["slots_in_use"]) == (8, 3)


def test_due_jobs_held_back_by_no_worker_or_full_slots(admin_client):
    enqueue("a.job", queue="mail")
    enqueue("a.job", queue="mail")
    assert _live_queue(admin_client, "mail")["held_back_by"] == ["no_worker"]
    worker = Worker.objects.create(hostname="w", pid=1, queues=["mail"], concurrency=1)
    assert _live_queue(admin_client, "mail")["held_back_by"] == []
    assert _claim("mail", str(worker.id))
    assert _live_queue(admin_client, "mail")["held_back_by"] == ["slots"]
    Worker.objects.create(hostname="other", pid=2, queues=["reports"], concurrency=4)
    assert _live_queue(admin_client, "mail")["held_back_by"] == ["slots"]
    page = admin_client.get(reverse("admin:soniq_django_dashboard")).content.decode()
    assert "every slot of its workers is in use" in page
    assert "2 live workers: 1 of 5 slots in use." in page


def test_the_live_workers_table_names_its_version_column_and_shows_slots(admin_client):
    worker = Worker.objects.create(hostname="web-1", pid=321, queues=["mail"], concurrency=4,
                                   version="soniq_django 9.9")
    enqueue("a.job", queue="mail")
    assert _claim("mail", str(worker.id))
    module = admin_client.get(reverse("admin:soniq_django_dashboard_live")).json()[
        "modules"]["soniq-workers"]
    headings = [cell.split(">", 1)[1].split("<")[0] for cell in module.split("<th scope=\"col\"")[1:]]
    assert "Runs" not in headings and "Version" in headings and "Slots in use" in headings
    row = module.split(f'data-worker="{worker.id}"')[1].split("</tr>")[0]
    assert "1 of 4" in row and "soniq_django 9.9" in row


def test_the_site_index_and_the_app_index_link_the_dashboard(client, django_user_model):
    viewer = _user(client, django_user_model, "view_job")
    url = reverse("admin:soniq_django_dashboard")
    for page in (reverse("admin:index"), reverse("admin:app_list", args=["soniq_django"])):
        html = viewer.get(page).content.decode()
        row = html.split('<tr class="model-dashboard')[1].split("</tr>")[0]
        assert f'<a href="{url}">Dashboard</a>' in row, page
        assert "<td>" not in row.split("Dashboard</a>")[1].split("</th>")[0]
    other = django_user_model.objects.create_user("other", is_staff=True)
    other.user_permissions.set(Permission.objects.filter(codename="view_worker"))
    client.force_login(other)
    assert url not in client.get(reverse("admin:index")).content.decode()


def test_a_replayed_dead_letter_and_the_split_leave_job_rows_alone(admin_client):
    """The dashboard writes nothing: reading it twice leaves every table as it was."""
    _dead_letter()
    enqueue("a.job", queue="mail", run_at=dt.timedelta(hours=1))
    before = (list(Job.objects.values_list("id", "status", "updated_at")),
              DeadLetterJob.objects.count(), QueueSetting.objects.count())
    admin_client.get(reverse("admin:soniq_django_dashboard"))
    admin_client.get(reverse("admin:soniq_django_dashboard_live"))
    assert before == (list(Job.objects.values_list("id", "status", "updated_at")),
                      DeadLetterJob.objects.count(), QueueSetting.objects.count())


# -- item 10: the task registry keeps no default values ------------------------------------

def test_the_task_registry_stores_no_default_values(admin_client, monkeypatch):
    """``api_key=settings.KEY`` is stored and shown as ``api_key=…``, never its value."""
    from typing import Annotated

    from soniq_django import job, registry
    from soniq_django.admin.registry import registration_url
    from soniq_django.worker.registration import publish_registry

    monkeypatch.setattr(registry, "_registry", {})
    secret = "sk-live-0123456789-secret"

    @job(name="shop.call_api", queue="api")
    def call_api(order: int, /, note: Annotated[str, secret] = secret, *more: int,
                 api_key: str = secret, retries=3, **extra: str) -> dict:
        return {}

    worker = Worker.objects.create(hostname="w", pid=1)
    publish_registry("default", str(worker.id))
    row = TaskRegistration.objects.get(task_name="shop.call_api")
    assert row.args_model_repr == (
        "test_the_task_registry_stores_no_default_values.<locals>.call_api"
        "(order: int, /, note: str = …, *more: int, api_key: str = …, retries=…, "
        "**extra: str) -> dict")
    page = admin_client.get(registration_url(row)).content.decode()
    assert secret not in page and "api_key: str = …" in page

"""The dashboard's live endpoint and its Pause/Resume buttons, through the test client.

On both databases. The buttons are checked for the permission they need,
for CSRF, for the row they change (on the write alias) and for the admin
log entry they leave; the endpoint for its JSON, its permission and for
drawing the same module bodies as the page.
"""

import re
from unittest import mock

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from soniq_django import enqueue, pause_queue
from soniq_django.admin import live
from soniq_django.models import QueueSetting
from soniq_django.owned import OwnedJobSource
from tests.support.owned import nonce

pytestmark = pytest.mark.django_db

DASHBOARD = "admin:soniq_django_dashboard"
LIVE = "admin:soniq_django_dashboard_live"
QUEUE = "admin:soniq_django_dashboard_queue"


def _staff(client, django_user_model, *codenames: str) -> Client:
    user = django_user_model.objects.create_user("staff", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client.force_login(user)
    return client


def test_live_endpoint_returns_the_figures_and_the_module_bodies(admin_client):
    enqueue("a.job", queue="mail")
    enqueue("a.job", queue="mail")
    running = enqueue("b.job", queue="reports")
    assert OwnedJobSource().claim_next_owned("w", claim_token=nonce(),
                                             queues=["reports"]).job_id == running
    pause_queue("idle")  # a settings row and no job: still a row of the table
    response = admin_client.get(reverse(LIVE))
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert "no-store" in response["Cache-Control"]  # admin_view: never cached
    data = response.json()
    assert set(data) == {"as_of", "as_of_text", "updated_text", "refresh_seconds", "figures",
                         "modules"}
    assert data["refresh_seconds"] == live.REFRESH_SECONDS
    assert len(data["updated_text"]) == 8 and data["updated_text"].count(":") == 2
    figures = data["figures"]
    assert [q["queue"] for q in figures["queues"]] == ["idle", "mail", "reports"]
    by_name = {q["queue"]: q for q in figures["queues"]}
    assert by_name["mail"]["counts"] == {"queued": 2, "processing": 0, "done": 0,
                                         "cancelled": 0, "dead_letter": 0}
    assert by_name["mail"]["queued"] == {"due": 2, "scheduled": 0, "retrying": 0, "waiting": 0}
    assert by_name["mail"]["limits"] == {"concurrency": None, "running": 0, "rate": None,
                                         "started": 0}
    assert by_name["mail"]["held_back_by"] == ["no_worker"]
    assert by_name["mail"]["oldest_wait_seconds"] >= 0 and not by_name["mail"]["paused"]
    assert by_name["reports"]["counts"]["processing"] == 1
    assert by_name["idle"]["paused"] and by_name["idle"]["oldest_wait_seconds"] is None
    assert figures["totals"]["queued"] == 2 and figures["totals"]["processing"] == 1
    assert figures["queued_totals"] == {"due": 2, "scheduled": 0, "retrying": 0,
                                        "waiting": 0}
    assert set(figures) == {"queues", "totals", "queued_totals", "dead_letters_by_reason",
                            "live_workers", "silent_workers", "slots", "slots_in_use",
                            "finished_last_hour", "estimated"}
    assert figures["estimated"] == []  # a small table: every number counted
    assert list(data["modules"]) == [module_id for module_id, _ in live.MODULES]
    queues = data["modules"]["soniq-queues"]
    assert 'data-queue="idle" class="paused"' in queues and "Resume" in queues
    assert 'name="csrfmiddlewaretoken"' in queues


def test_the_page_draws_the_same_module_bodies_as_the_endpoint(admin_client):
    enqueue("a.job", queue="mail")
    pause_queue("idle")
    frozen = timezone.now()
    with mock.patch("django.utils.timezone.now", return_value=frozen):
        page = admin_client.get(reverse(DASHBOARD)).content.decode()
        data = admin_client.get(reverse(LIVE)).json()
    assert f'data-live-url="{reverse(LIVE)}"' in page
    assert f'data-refresh-seconds="{live.REFRESH_SECONDS}"' in page

    def without_tokens(html: str) -> str:  # each render masks the CSRF token afresh
        return re.sub(r'name="csrfmiddlewaretoken" value="[^"]*"', "", html)

    for module_id, body in data["modules"].items():
        opening = f'<div class="module" id="{module_id}" data-live-module="{module_id}">\n'
        drawn = page.split(opening)[1].rsplit("</div>", 1)[0]
        assert without_tokens(body) in without_tokens(drawn), module_id
    assert "Jobs per queue" in data["modules"]["soniq-queues"]


def test_live_endpoint_needs_the_dashboards_permission(client, django_user_model):
    url = reverse(LIVE)
    assert client.get(url).status_code == 302  # anonymous: to the login page
    staff = _staff(client, django_user_model)
    assert staff.get(url).status_code == 403
    user = django_user_model.objects.get(username="staff")
    user.user_permissions.set(Permission.objects.filter(codename="view_job"))
    client.force_login(user)
    assert client.get(url).status_code == 200
    assert client.post(url).status_code == 405


def test_non_staff_get_the_login_page_not_the_figures(client, django_user_model):
    user = django_user_model.objects.create_user("visitor")
    user.user_permissions.set(Permission.objects.filter(codename="view_job"))
    client.force_login(user)
    response = client.get(reverse(LIVE))
    assert response.status_code == 302 and response.url.startswith(reverse("admin:login"))


def _press(client, queue: str, action: str):
    response = client.post(reverse(QUEUE), {"queue": queue, "action": action})
    notes = [str(m) for m in get_messages(response.wsgi_request)]
    if response.status_code == 302:
        client.get(response.url)  # shows (and so clears) the messages, as a browser would
    return response, notes


def test_pause_and_resume_buttons_change_the_row_and_log_it(admin_client):
    enqueue("a.job", queue="mail")
    page = admin_client.get(reverse(DASHBOARD)).content.decode()
    assert 'name="action" value="pause"' in page
    response, notes = _press(admin_client, "mail", "pause")
    assert response.status_code == 302 and response.url == reverse(DASHBOARD)
    assert notes == ["Paused queue “mail”."]
    row = QueueSetting.objects.get(queue="mail")
    assert (row.paused, row.paused_by) == (True, "admin") and row.paused_at is not None
    entry = LogEntry.objects.get()
    assert (entry.action_flag, entry.object_id, entry.object_repr) == (CHANGE, "mail", str(row))
    assert entry.content_type.model_class() is QueueSetting
    assert entry.get_change_message() == "Paused the queue from the dashboard."
    assert 'name="action" value="resume"' in admin_client.get(reverse(DASHBOARD)).content.decode()

    _, notes = _press(admin_client, "mail", "pause")
    assert notes == ["Queue “mail” was already paused: nothing changed."]
    assert LogEntry.objects.count() == 1  # nothing changed, nothing logged

    _, notes = _press(admin_client, "mail", "resume")
    assert notes == ["Resumed queue “mail”."]
    row.refresh_from_db()
    assert (row.paused, row.paused_by, row.paused_at) == (False, None, None)
    assert LogEntry.objects.count() == 2
    assert LogEntry.objects.latest("id").get_change_message() == (
        "Resumed the queue from the dashboard.")


def test_the_buttons_need_the_change_queue_setting_permission(client, django_user_model):
    enqueue("a.job", queue="mail")
    viewer = _staff(client, django_user_model, "view_job")
    page = viewer.get(reverse(DASHBOARD)).content.decode()
    assert "Running" in page and 'name="action"' not in page
    response, _ = _press(viewer, "mail", "pause")
    assert response.status_code == 403
    assert not QueueSetting.objects.exists()
    user = django_user_model.objects.get(username="staff")
    # Pausing a queue without a settings row adds one: "add" as well as "change".
    user.user_permissions.add(*Permission.objects.filter(
        codename__in=["change_queuesetting", "add_queuesetting"]))
    response, _ = _press(viewer, "mail", "pause")
    assert response.status_code == 302 and QueueSetting.objects.get().paused


def test_the_buttons_need_a_csrf_token_and_a_post(django_user_model):
    enqueue("a.job", queue="mail")
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(django_user_model.objects.create_superuser("root", "r@example.com",
                                                                   password=None))
    assert browser.post(reverse(QUEUE), {"queue": "mail", "action": "pause"}).status_code == 403
    assert browser.get(reverse(QUEUE), {"queue": "mail", "action": "pause"}).status_code == 405
    assert not QueueSetting.objects.exists()
    page = browser.get(reverse(DASHBOARD))
    token = page.cookies["csrftoken"].value
    response = browser.post(reverse(QUEUE), {"queue": "mail", "action": "pause",
                                             "csrfmiddlewaretoken": token})
    assert response.status_code == 302 and QueueSetting.objects.get(queue="mail").paused


@pytest.mark.parametrize(("form", "status"), [
    ({"queue": "mail", "action": "drop"}, 400),
    ({"queue": "", "action": "pause"}, 400),
    ({"queue": "x" * 256, "action": "pause"}, 400),
])
def test_the_buttons_refuse_what_is_not_a_pause_or_a_queue(admin_client, form, status):
    assert admin_client.post(reverse(QUEUE), form).status_code == status
    assert not QueueSetting.objects.exists() and not LogEntry.objects.exists()

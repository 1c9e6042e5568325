"""The actions on a job's and a dead letter's own page (admin/page_actions.py), both databases.

Each button runs the list's action on that one row: same permission, same
service, same admin log entry; it is shown only when it does something.
"""

import datetime as dt

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.urls import reverse
from django.utils import timezone

from soniq_django import enqueue
from soniq_django.models import DeadLetterJob, Job
from soniq_django.owned import OwnedJobSource
from tests.support.owned import nonce, rewrite

pytestmark = pytest.mark.django_db


def _login(client, django_user_model, *codenames: str):
    user = django_user_model.objects.create_user("staff", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client.force_login(user)
    return client


def _page(client, model: str, pk) -> str:
    response = client.get(reverse(f"admin:soniq_django_{model}_change", args=[pk]))
    assert response.status_code == 200
    return response.content.decode()


def _act(model: str, pk, action: str) -> str:
    return reverse(f"admin:soniq_django_{model}_page_action", args=[pk, action])


def _claim(queue: str = "default"):
    claimed = OwnedJobSource().claim_next_owned("worker-a", claim_token=nonce(), queues=[queue])
    assert claimed is not None
    return claimed


def test_a_queued_jobs_page_cancels_it_and_logs_it(client, django_user_model):
    job_id = enqueue("shop.mail")
    operator = _login(client, django_user_model, "view_job", "change_job")
    page = _page(operator, "job", job_id)
    assert f'action="{_act("job", job_id, "cancel_selected")}"' in page
    assert "retry_selected_now" not in page  # due already: nothing to make due
    response = operator.post(_act("job", job_id, "cancel_selected"))
    assert response.status_code == 302
    assert response["Location"] == reverse("admin:soniq_django_job_change", args=[job_id])
    assert Job.objects.get(id=job_id).status == "cancelled"
    assert LogEntry.objects.get().change_message == "Cancelled from the admin."
    assert "Cancelled 1 job." in operator.get(response["Location"]).content.decode()
    assert "cancel_selected" not in _page(operator, "job", job_id)  # finished: no button


def test_a_running_job_is_asked_to_stop_once(client, django_user_model):
    job_id = enqueue("shop.report")
    _claim()
    operator = _login(client, django_user_model, "view_job", "change_job")
    operator.post(_act("job", job_id, "cancel_selected"))
    row = Job.objects.get(id=job_id)
    assert (row.status, row.cancel_requested) == ("processing", True)
    assert "cancel_selected" not in _page(operator, "job", job_id)


def test_a_job_waiting_for_its_retry_is_made_due_now(client, django_user_model):
    job_id = enqueue("shop.flaky", max_attempts=3)
    OwnedJobSource().fail_owned(_claim().claim_fence, "Boom", retry=True, retry_delay=3600)
    operator = _login(client, django_user_model, "view_job", "change_job")
    assert _act("job", job_id, "retry_selected_now") in _page(operator, "job", job_id)
    operator.post(_act("job", job_id, "retry_selected_now"))
    assert Job.objects.get(id=job_id).scheduled_at <= timezone.now()
    assert "retry_selected_now" not in _page(operator, "job", job_id)


def test_a_dead_letters_page_replays_it(client, django_user_model):
    job_id = enqueue("shop.charge")
    OwnedJobSource().fail_owned(_claim().claim_fence, "ValueError: declined", retry=False)
    operator = _login(client, django_user_model, "view_deadletterjob", "change_deadletterjob",
                      "view_job")
    assert _act("deadletterjob", job_id, "replay_selected") in _page(
        operator, "deadletterjob", job_id)
    response = operator.post(_act("deadletterjob", job_id, "replay_selected"))
    assert response["Location"] == reverse("admin:soniq_django_deadletterjob_change",
                                           args=[job_id])
    assert Job.objects.get(id=job_id).status == "queued"
    # Back in the queue: replaying again would do nothing, so no button.
    assert "replay_selected" not in _page(operator, "deadletterjob", job_id)


def test_a_view_only_user_sees_no_button_and_cannot_post(client, django_user_model):
    job_id = enqueue("shop.mail")
    viewer = _login(client, django_user_model, "view_job")
    assert "soniq-page-action" not in _page(viewer, "job", job_id)
    assert viewer.post(_act("job", job_id, "cancel_selected")).status_code == 403
    assert Job.objects.get(id=job_id).status == "queued"


def test_only_posts_of_the_pages_own_actions_on_an_existing_row(client, django_user_model):
    job_id = enqueue("shop.mail")
    operator = _login(client, django_user_model, "view_job", "change_job", "delete_job")
    assert operator.get(_act("job", job_id, "cancel_selected")).status_code == 405
    assert operator.post(_act("job", job_id, "delete_selected_finished")).status_code == 404
    assert operator.post(_act("job", "0" * 32, "cancel_selected")).status_code == 404
    assert Job.objects.get(id=job_id).status == "queued"


def test_the_dead_letter_list_shows_each_errors_last_line(admin_client):
    job_id = enqueue("shop.charge")
    OwnedJobSource().fail_owned(
        _claim().claim_fence, 'Traceback (most recent call last):\n  File "x"\n'
        "ValueError: card <b>declined</b>\n", retry=False)
    assert DeadLetterJob.objects.filter(id=job_id).exists()
    page = admin_client.get(reverse("admin:soniq_django_deadletterjob_changelist"))
    text = page.content.decode()
    assert "ValueError: card &lt;b&gt;declined&lt;/b&gt;" in text and "<b>declined" not in text


def test_the_claim_section_links_the_worker(admin_client):
    from soniq_django.models import Worker

    worker = Worker.objects.create(hostname="host-1", pid=42)
    job_id = enqueue("shop.mail")
    OwnedJobSource().claim_next_owned(str(worker.id), claim_token=nonce())
    rewrite(job_id, claimed_at=timezone.now() - dt.timedelta(minutes=3))
    page = _page(admin_client, "job", job_id)
    assert reverse("admin:soniq_django_worker_change", args=[worker.id]) in page
    assert "running for 3 min" in page

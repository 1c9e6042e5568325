"""The queue settings admin: pause, resume and override a queue's limits (docs/operations.md)."""

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse

from soniq_django import pause_queue
from soniq_django.models import QueueSetting

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:soniq_django_queuesetting_changelist"


def _change(queue: str) -> str:
    return reverse("admin:soniq_django_queuesetting_change", args=[queue])


def _form(**values) -> dict:
    form = {"queue": "emails", "concurrency": "", "rate_limit": "", "rate_period": ""}
    form.update({key: str(value) for key, value in values.items()})
    return form


def test_the_pages_render_and_show_what_the_claims_apply(admin_client):
    QueueSetting.objects.create(queue="emails", configured_concurrency=5,
                                configured_rate_limit=10, configured_rate_period=1)
    QueueSetting.objects.create(queue="sms", rate_limit=3, rate_period=60, paused=True)
    page = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert "10 per 1 s" in page and "3 per 60 s" in page
    detail = admin_client.get(_change("emails")).content.decode()
    assert "concurrency 5; rate 10 per 1 s" in detail
    assert admin_client.get(reverse("admin:soniq_django_queuesetting_add")).status_code == 200


def test_adding_a_row_pauses_a_queue_and_records_who(admin_client):
    response = admin_client.post(reverse("admin:soniq_django_queuesetting_add"),
                                 _form(paused="on", concurrency=2))
    assert response.status_code == 302, response.content[:2000]
    row = QueueSetting.objects.get(queue="emails")
    assert (row.paused, row.paused_by, row.concurrency) == (True, "admin", 2)
    assert row.paused_at is not None


def test_a_save_writes_the_edited_columns_only(admin_client):
    QueueSetting.objects.create(queue="emails", configured_concurrency=5)
    page = admin_client.get(_change("emails"))  # the form as the operator saw it
    assert page.status_code == 200
    # A worker starts meanwhile and writes SONIQ["QUEUES"] again.
    QueueSetting.objects.filter(queue="emails").update(configured_concurrency=7)
    response = admin_client.post(_change("emails"), _form(concurrency=3))
    assert response.status_code == 302, response.content[:2000]
    row = QueueSetting.objects.get(queue="emails")
    assert (row.concurrency, row.configured_concurrency, row.paused) == (3, 7, False)


@pytest.mark.parametrize(("values", "error"), [
    ({"rate_limit": 5}, "Set a rate&#x27;s count and its period together"),
    ({"rate_period": 5}, "Set a rate&#x27;s count and its period together"),
    ({"concurrency": 0}, "Must be at least 1"),
    ({"rate_limit": 5, "rate_period": 86401}, "At most 86400 seconds"),
])
def test_the_form_refuses_limits_the_claim_cannot_apply(admin_client, values, error):
    response = admin_client.post(reverse("admin:soniq_django_queuesetting_add"), _form(**values))
    assert response.status_code == 200 and error in response.content.decode()
    assert not QueueSetting.objects.exists()


def test_pause_and_resume_actions(admin_client):
    QueueSetting.objects.create(queue="a")
    QueueSetting.objects.create(queue="b")
    pause_queue("b")

    def act(action):
        response = admin_client.post(reverse(CHANGELIST), {
            "action": action, "_selected_action": ["a", "b"], "index": 0})
        assert response.status_code == 302
        notes = [str(m) for m in get_messages(response.wsgi_request)]
        admin_client.get(response.url)  # shows (and so clears) the messages
        return notes

    assert act("pause_selected") == ["Paused 1 queue; 1 already paused."]
    assert QueueSetting.objects.get(queue="a").paused_by == "admin"
    assert act("resume_selected") == ["Resumed 2 queues."]
    assert not QueueSetting.objects.filter(paused=True).exists()


def test_changelist_lookups_are_the_filters_only(admin_client):
    assert admin_client.get(reverse(CHANGELIST) + "?paused__exact=1").status_code == 200
    assert admin_client.get(reverse(CHANGELIST) + "?paused_by__regex=^a").status_code == 400

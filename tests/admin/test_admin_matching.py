""""Replay all matching" and "Retry all matching now": the whole filtered list, not the page.

On both databases. Dead letters and jobs are made by the real services;
each test checks that only the rows the list's filters match change,
through the service the per-row action uses, in batches, within the cap.
"""

import datetime as dt
from unittest import mock

import pytest
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from soniq_django import enqueue, operations, replay
from soniq_django.admin import DeadLetterJobAdmin
from soniq_django.errors import ErrorCode, SoniqError
from soniq_django.models import DeadLetterJob, Job
from soniq_django.owned import OwnedJobSource
from tests.support.owned import nonce

pytestmark = pytest.mark.django_db

REPLAY = "admin:soniq_django_deadletterjob_matching"
RETRY = "admin:soniq_django_job_matching"
DEAD_LIST = "admin:soniq_django_deadletterjob_changelist"


@pytest.fixture
def admin_client(client, django_user_model):
    client.force_login(django_user_model.objects.create_superuser("admin", "admin@example.com",
                                                                  password=None))
    return client


def _dead(queue: str, count: int, job_name: str = "billing.charge") -> list:
    source, ids = OwnedJobSource(), []
    for i in range(count):
        ids.append(enqueue(job_name, {"n": i}, queue=queue))
        claimed = source.claim_next_owned("w", claim_token=nonce(), queues=[queue])
        assert source.fail_owned(claimed.claim_fence, "ValueError: no", retry=False)
    return ids


def _post(client, url: str):
    response = client.post(url)
    assert response.status_code == 302, response.content[:500]
    notes = [str(m) for m in get_messages(response.wsgi_request)]
    client.get(response.url)  # shows (and so clears) the messages, as a browser would
    return response, notes


def test_the_list_offers_the_button_with_its_current_filters(admin_client):
    _dead("billing", 1)
    page = admin_client.get(reverse(DEAD_LIST) + "?queue=billing&p=1").content.decode()
    assert f'href="{reverse(REPLAY, args=["replay"])}?queue=billing"' in page
    assert "Replay all matching…" in page
    jobs = admin_client.get(reverse("admin:soniq_django_job_changelist")).content.decode()
    assert f'href="{reverse(RETRY, args=["retry-now"])}"' in jobs


def test_replay_all_matching_replays_only_the_filtered_rows_in_batches(admin_client, monkeypatch):
    billing = _dead("billing", 5)
    mail = _dead("mail", 2)
    url = reverse(REPLAY, args=["replay"]) + "?queue=billing"
    page = admin_client.get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assert "5 dead letters match on every page of the list" in html
    assert "<code>queue=billing</code>" in html
    assert not Job.objects.filter(id__in=billing + mail).exists()  # the page changed nothing

    monkeypatch.setattr(DeadLetterJobAdmin, "matching_batch", 2)
    with mock.patch.object(replay, "replay_dead_letters",
                           wraps=replay.replay_dead_letters) as spy:
        response, notes = _post(admin_client, url)
    assert [len(call.kwargs["ids"]) for call in spy.call_args_list] == [2, 2, 1]
    assert response.url == reverse(DEAD_LIST) + "?queue=billing"
    assert notes == ["Replayed 5 dead letters into the queue."]
    assert set(Job.objects.values_list("id", flat=True)) == set(billing)
    assert set(DeadLetterJob.objects.filter(resurrection_count=1).values_list(
        "id", flat=True)) == set(billing)

    # Again: every one is back in the queue now, and says so.
    _, notes = _post(admin_client, url)
    assert notes == ["Replayed 0 dead letters into the queue. Skipped: 5 already in the queue."]


def test_replay_all_matching_follows_search_and_every_filter(admin_client):
    charge = _dead("billing", 2, job_name="billing.charge")
    refund = _dead("billing", 1, job_name="billing.refund")
    url = reverse(REPLAY, args=["replay"]) + "?queue=billing&q=refund"
    assert "1 dead letter matches" in admin_client.get(url).content.decode()
    _, notes = _post(admin_client, url)
    assert notes == ["Replayed 1 dead letter into the queue."]
    assert list(Job.objects.values_list("id", flat=True)) == refund
    assert not Job.objects.filter(id__in=charge).exists()


def test_more_than_the_cap_is_refused_and_nothing_is_done(admin_client, monkeypatch):
    ids = _dead("billing", 3)
    monkeypatch.setattr(DeadLetterJobAdmin, "matching_cap", 2)
    url = reverse(REPLAY, args=["replay"])
    html = admin_client.get(url).content.decode()
    assert "3 dead letters match: more than 2" in html and 'value="Yes, ' not in html
    _, notes = _post(admin_client, url)
    assert notes == ["Nothing done: more than 2 dead letters match. Narrow the filter, or use "
                     "manage.py soniq_replay --reason REASON (or --all)."]
    assert not Job.objects.filter(id__in=ids).exists()
    monkeypatch.setattr(DeadLetterJobAdmin, "matching_cap", 3)
    _, notes = _post(admin_client, url)
    assert notes == ["Replayed 3 dead letters into the queue."]


def test_a_database_error_stops_and_says_what_was_done(admin_client, monkeypatch):
    _dead("billing", 3)
    monkeypatch.setattr(DeadLetterJobAdmin, "matching_batch", 2)
    real = replay.replay_dead_letters
    calls = []

    def second_batch_fails(using, *, ids):
        calls.append(ids)
        if len(calls) == 2:
            raise SoniqError(ErrorCode.QUEUE_PERSISTENCE_FAILED, "the database failed")
        return real(using, ids=ids)

    monkeypatch.setattr(replay, "replay_dead_letters", second_batch_fails)
    _, notes = _post(admin_client, reverse(REPLAY, args=["replay"]))
    assert notes == ["Stopped by a database error: the database failed. Rows done before it "
                     "stay done (earlier batches: Replayed 2 dead letters into the queue.)"]
    assert Job.objects.count() == 2


def test_no_match_and_unknown_operations_and_refused_lookups(admin_client):
    _dead("billing", 1)
    html = admin_client.get(reverse(REPLAY, args=["replay"]) + "?queue=nothing").content.decode()
    assert "No dead letter matches these filters" in html and 'value="Yes, ' not in html
    assert admin_client.get(reverse(REPLAY, args=["purge"])).status_code == 404
    # The list's own lookup rules: no lookup its filters do not make, none on a fence.
    assert admin_client.get(reverse(REPLAY, args=["replay"])
                            + "?submission_id__startswith=a").status_code == 400
    assert admin_client.post(reverse(REPLAY, args=["replay"])
                             + "?args__contains=x").status_code == 400
    assert not Job.objects.exists()


def test_all_matching_needs_the_actions_permission_and_csrf(client, django_user_model):
    ids = _dead("billing", 1)
    user = django_user_model.objects.create_user("viewer", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(
        codename__in=["view_job", "view_deadletterjob"]))
    client.force_login(user)
    assert "all matching" not in client.get(reverse(DEAD_LIST)).content.decode()
    url = reverse(REPLAY, args=["replay"])
    assert client.get(url).status_code == 403
    assert client.post(url).status_code == 403
    assert not Job.objects.exists()

    user.user_permissions.add(Permission.objects.get(codename="change_deadletterjob"))
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    assert strict.post(url).status_code == 403  # no CSRF token
    token = strict.get(url).cookies["csrftoken"].value
    assert strict.post(url, {"csrfmiddlewaretoken": token}).status_code == 302
    assert list(Job.objects.values_list("id", flat=True)) == ids


def test_retry_all_matching_now_makes_only_the_filtered_waiting_jobs_due(admin_client):
    later = timezone.now() + dt.timedelta(hours=1)
    mail = [enqueue("a.job", {"n": i}, queue="mail", run_at=later) for i in range(3)]
    other = enqueue("a.job", queue="other", run_at=later)
    due = enqueue("a.job", {"n": 9}, queue="mail")
    url = reverse(RETRY, args=["retry-now"]) + "?queue=mail&status__exact=queued"
    assert "4 jobs match" in admin_client.get(url).content.decode()
    with mock.patch.object(operations, "retry_now_ids", wraps=operations.retry_now_ids) as spy:
        _, notes = _post(admin_client, url)
    assert spy.call_count == 1 and set(spy.call_args.args[0]) == {*mail, due}
    assert notes == ["Made 3 waiting jobs due now; skipped 1 not queued for later."]
    now = timezone.now()
    assert all(Job.objects.get(id=i).scheduled_at <= now for i in mail)
    assert Job.objects.get(id=other).scheduled_at == later

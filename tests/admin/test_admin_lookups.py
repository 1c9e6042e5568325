"""Changelist URL lookups: only what each admin's own filters offer, never a fence column.

Django's admin takes any model field as a changelist URL lookup, so a staff
user with only the "view job" permission could recover a live job's
claim token with ``?claim_token__startswith=…`` one hex digit at a time
(the row is listed, or not). Every soniq admin refuses such lookups: Django
answers 400 Bad Request, and no row data is in the answer.
"""

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse
from django.utils import timezone

from soniq_django import enqueue
from soniq_django.admin import FENCE_COLUMNS, OfferedLookupsOnly
from soniq_django.producer.request import JobRequest
from soniq_django.models import DeadLetterJob, Job, RecurringJob, TaskRegistration, Worker
from soniq_django.owned import OwnedJobSource
from tests.support.owned import nonce

pytestmark = pytest.mark.django_db

MODELS = ("job", "deadletterjob", "recurringjob", "worker", "taskregistration", "queuesetting",
          "keylimit", "keyslot")


@pytest.fixture
def viewer(client, django_user_model):
    """A staff user with only the view permissions of soniq's tables."""
    user = django_user_model.objects.create_user("viewer", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(
        content_type__app_label="soniq_django", codename__startswith="view_"))
    client.force_login(user)
    assert not user.has_perm("soniq_django.change_job")
    return client


@pytest.fixture
def secrets_in_rows():
    """A live owned claim, and a dead-lettered owned submission, with every fence column set."""
    source = OwnedJobSource()
    live = source.submit_owned(JobRequest("shop.charge", {"order": 7}, queue="fenced"),
                               submission_id="sub-live-7")
    token = nonce()
    claim = source.claim_next_owned("worker-secret", claim_token=token, queues=["fenced"])
    assert claim.job_id == live
    source.submit_owned(JobRequest("shop.refund", {"order": 8}, queue="doomed"),
                        submission_id="sub-dead-8")
    doomed = source.claim_next_owned("worker-secret", claim_token=nonce(), queues=["doomed"])
    assert source.fail_owned(doomed.claim_fence, "declined", retry=False)
    worker = Worker.objects.create(hostname="host-a", pid=7, queues=["fenced"],
                                   metadata={"region": "eu"})
    TaskRegistration.objects.create(task_name="shop.charge", worker_id=str(worker.id),
                                    queue="fenced", args_model_repr="Charge(order: int)")
    RecurringJob.objects.create(job_name="shop.nightly", schedule_type="interval",
                                schedule_value="3600", job_kwargs={"scope": "all"})
    row = Job.objects.get(id=live)
    assert row.claim_token == token and row.claim_generation >= 1
    assert row.submission_fingerprint
    dead = DeadLetterJob.objects.get(id=doomed.job_id)
    assert dead.submission_id == "sub-dead-8" and dead.submission_fingerprint
    return {"job": row, "dead": dead, "worker": worker}


def _changelist(model: str) -> str:
    return reverse(f"admin:soniq_django_{model}_changelist")


def _refused(client, model: str, params: dict, shown: list[str]):
    response = client.get(_changelist(model), params)
    assert response.status_code == 400, (model, params, response.status_code)
    html = response.content.decode()
    assert "result_list" not in html
    for text in shown:
        assert text not in html, (model, params, text)


def test_the_claim_token_cannot_be_found_by_any_lookup(viewer, secrets_in_rows):
    job = secrets_in_rows["job"]
    token = job.claim_token
    shown = [str(job.id), "shop.charge", token]
    for params in (
        {"claim_token__regex": f"^{token[0]}"},
        {"claim_token__iregex": "^[0-9a-f]"},
        {"claim_token": token},
        {"claim_token__exact": token},
        {"claim_token__iexact": token.upper()},
        {"claim_token__startswith": token[:1]},
        {"claim_token__istartswith": token[:2]},
        {"claim_token__contains": token[5:9]},
        {"claim_token__endswith": token[-1]},
        {"claim_token__gt": "8"},
        {"claim_token__lte": "8"},
        {"claim_token__in": f"{token},{nonce()}"},
        {"claim_token__isnull": "False"},
        {"claim_token__lower__startswith": token[:1]},
        {"claim_token__length": "32"},
        # Through a relation, or spelled like one.
        {"pk__claim_token__startswith": token[:1]},
        {"worker__claim_token": token},
        {"job__claim_token__startswith": token[:1]},
        {"worker_id__claim_token": token},
        # Next to a filter the admin does offer.
        {"status__exact": "processing", "claim_token__startswith": token[:1]},
        {"queue": "fenced", "claim_token__regex": "^."},
    ):
        _refused(viewer, "job", params, shown)


def test_a_right_guess_and_a_wrong_guess_get_the_same_answer(viewer, secrets_in_rows):
    token = secrets_in_rows["job"].claim_token
    answers = {
        (response.status_code, response.content)
        for digit in "0123456789abcdef"
        for response in [viewer.get(_changelist("job"), {"claim_token__startswith": digit})]
    }
    assert answers == {(400, next(iter(answers))[1])}
    right = viewer.get(_changelist("job"), {"claim_token__startswith": token[:1]})
    assert (right.status_code, right.content) in answers


def test_the_other_fence_columns_are_refused_too(viewer, secrets_in_rows):
    job, dead = secrets_in_rows["job"], secrets_in_rows["dead"]
    for params in (
        {"claim_owner": "worker-secret"},
        {"claim_owner__startswith": "w"},
        {"claim_generation": str(job.claim_generation)},
        {"claim_generation__gte": "1"},
        {"submission_id": "sub-live-7"},
        {"submission_id__contains": "live"},
        {"submission_id__isnull": "False"},
        {"submission_fingerprint": job.submission_fingerprint},
        {"submission_fingerprint__startswith": job.submission_fingerprint[:1]},
    ):
        _refused(viewer, "job", params, [str(job.id), "shop.charge"])
    for params in (
        {"submission_id": "sub-dead-8"},
        {"submission_id__regex": "^sub"},
        {"submission_fingerprint__startswith": dead.submission_fingerprint[:1]},
        {"submission_fingerprint__isnull": "False"},
    ):
        _refused(viewer, "deadletterjob", params, [str(dead.id), "shop.refund"])


def test_lookups_no_filter_offers_are_refused_on_every_admin(viewer, secrets_in_rows):
    job, dead, worker = (secrets_in_rows[k] for k in ("job", "dead", "worker"))
    for model, params, shown in (
        ("job", {"args__order": "7"}, [str(job.id)]),
        ("job", {"last_error__contains": "x"}, [str(job.id)]),
        ("job", {"worker_id": str(job.worker_id)}, [str(job.id)]),
        ("job", {"lease_expires_at__gte": "2000-01-01"}, [str(job.id)]),
        ("job", {"id__startswith": str(job.id)[:2]}, [str(job.id)]),
        ("job", {"pk__in": str(job.id)}, [str(job.id)]),
        ("job", {"created_at__gte": "2000-01-01"}, [str(job.id)]),  # not a date drill-down
        ("job", {"status": "processing"}, [str(job.id)]),  # the filter's name is status__exact
        ("deadletterjob", {"args__order": "8"}, [str(dead.id)]),
        ("deadletterjob", {"last_error__startswith": "dec"}, [str(dead.id)]),
        ("deadletterjob", {"tags__isnull": "True"}, [str(dead.id)]),
        ("recurringjob", {"job_kwargs__scope": "all"}, ["shop.nightly"]),
        ("recurringjob", {"schedule_value__startswith": "36"}, ["shop.nightly"]),
        ("worker", {"metadata__region": "eu"}, ["host-a"]),
        ("worker", {"pid": "7"}, ["host-a"]),
        ("worker", {"id__startswith": str(worker.id)[:2]}, ["host-a"]),
        ("taskregistration", {"worker_id": str(worker.id)}, ["Charge"]),
        ("taskregistration", {"args_model_repr__contains": "order"}, ["Charge"]),
        ("taskregistration", {"last_seen_at__gte": "2000-01-01"}, ["Charge"]),
    ):
        _refused(viewer, model, params, shown)


def test_the_offered_filters_keep_working(viewer, secrets_in_rows):
    job, dead = secrets_in_rows["job"], secrets_in_rows["dead"]
    queued = enqueue("shop.mail", {"n": 1}, queue="mail")
    year = timezone.localtime().year
    now = timezone.localtime()

    def ids(model, params):
        response = viewer.get(_changelist(model), params)
        assert response.status_code == 200, (model, params)
        return [row.pk for row in response.context["cl"].result_list]

    assert ids("job", {"status__exact": "processing"}) == [job.id]
    assert ids("job", {"queue": "fenced"}) == [job.id]
    assert ids("job", {"job_name": "shop.mail"}) == [queued]
    assert ids("job", {"queue": "mail", "status__exact": "queued"}) == [queued]  # the dashboard's
    assert set(ids("job", {"created_at__year": year, "created_at__month": now.month,
                           "created_at__day": now.day})) == {job.id, queued}
    assert ids("job", {"created_at__year": year - 1}) == []
    assert ids("job", {"queue__isnull": "True"}) == []
    assert ids("deadletterjob", {"dead_letter_reason__exact": "permanent_failure"}) == [dead.id]
    assert ids("deadletterjob", {"queue": "doomed", "job_name": "shop.refund",
                                 "moved_to_dead_letter_at__year": year}) == [dead.id]
    assert len(ids("recurringjob", {"status__exact": "active", "schedule_type__exact": "interval",
                                    "queue": "default"})) == 1
    assert len(ids("worker", {"status__exact": "active", "serves": "some",
                              "hostname": "host-a"})) == 1
    assert len(ids("taskregistration", {"task_name": "shop.charge", "queue": "fenced"})) == 1
    # Search, ordering and paging are not lookups.
    assert ids("job", {"q": "shop.mail", "o": "2", "p": "1"}) == [queued]
    assert ids("job", {"q": job.claim_token}) == []  # the token is not searched


def test_each_admin_offers_exactly_its_filters_parameters(rf, admin_user):
    from django.contrib import admin

    request = rf.get("/")
    request.user = admin_user
    expected = {
        "job": {"status__exact", "status__isnull", "queue", "queue__isnull", "job_name",
                "job_name__isnull", "created_at__year", "created_at__month", "created_at__day"},
        "deadletterjob": {"dead_letter_reason__exact", "dead_letter_reason__isnull", "queue",
                          "queue__isnull", "job_name", "job_name__isnull",
                          "moved_to_dead_letter_at__year", "moved_to_dead_letter_at__month",
                          "moved_to_dead_letter_at__day"},
        "recurringjob": {"status__exact", "status__isnull", "schedule_type__exact",
                         "schedule_type__isnull", "queue", "queue__isnull"},
        "worker": {"status__exact", "status__isnull", "serves", "hostname", "hostname__isnull"},
        "taskregistration": {"task_name", "task_name__isnull", "queue", "queue__isnull"},
        "queuesetting": {"paused__exact", "paused__isnull"},
        "keylimit": set(), "keyslot": set(),
    }
    admins = {model_admin.opts.model_name: model_admin
              for model, model_admin in admin.site._registry.items()
              if model._meta.app_label == "soniq_django"}
    assert set(admins) == set(MODELS)
    for name, model_admin in admins.items():
        assert isinstance(model_admin, OfferedLookupsOnly), name
        assert model_admin.offered_lookups(request) == expected[name], name
        for lookup in expected[name]:
            # "2": a value a date drill-down part may have too (year, month or day).
            assert model_admin.lookup_allowed(lookup, "2", request), (name, lookup)


def test_fence_columns_are_refused_even_when_an_admin_offers_them(rf, admin_user):
    from django.contrib import admin

    from soniq_django.admin import JobAdmin

    class CarelessJobAdmin(JobAdmin):
        list_filter = ("status", "claim_token", "claim_owner", "claim_generation",
                       "submission_id", "submission_fingerprint")

    request = rf.get("/")
    request.user = admin_user
    careless = CarelessJobAdmin(Job, admin.AdminSite(name="careless"))
    assert "claim_token" in careless.offered_lookups(request)
    assert careless.lookup_allowed("status__exact", "queued", request)
    for column in FENCE_COLUMNS:
        for lookup in (column, f"{column}__isnull", f"{column}__startswith"):
            assert not careless.lookup_allowed(lookup, "a", request), lookup


def test_refused_lookups_are_refused_for_superusers_too(admin_client, secrets_in_rows):
    # Not a permission matter: nobody needs the secret, so nobody may search it.
    token = secrets_in_rows["job"].claim_token
    response = admin_client.get(_changelist("job"), {"claim_token": token})
    assert response.status_code == 400
    assert str(secrets_in_rows["job"].id) not in response.content.decode()


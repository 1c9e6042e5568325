"""Limits on what the admin's own pages and actions accept (issue 28, item 10).

A user who may only view can ask for any URL: a date drill-down to year
9999, a registry key that is no pair, a NUL in a filter or a search. Each
gets 400 or 404, never a 500. An action takes at most ``ACTION_CAP`` rows
in one request, ticked or "Select all N", and above it changes nothing.
A queue name longer than a queue's is refused by the form, and *Pause
selected* on such a row (written by SQL) reports it, pauses the others and
logs them. On both databases.
"""

import datetime as dt

import pytest
from django.contrib.admin import helpers
from django.contrib.admin import site as admin_site
from django.contrib.admin.models import LogEntry
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.urls import reverse

from soniq_django import enqueue
from soniq_django.admin import matching
from soniq_django.admin.base import ACTION_CAP
from soniq_django.models import Job, QueueSetting, RecurringJob

pytestmark = pytest.mark.django_db

LISTS = ("job", "deadletterjob", "recurringjob", "worker", "taskregistration", "queuesetting")


@pytest.fixture
def viewer(client, django_user_model):
    """A staff user with only the view permissions of soniq's tables."""
    user = django_user_model.objects.create_user("viewer", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(
        content_type__app_label="soniq_django", codename__startswith="view_"))
    client.force_login(user)
    return client


def _changelist(model: str) -> str:
    return reverse(f"admin:soniq_django_{model}_changelist")


@pytest.mark.parametrize("query", [
    "created_at__year=9999",
    "created_at__year=9999&created_at__month=12",
    "created_at__year=9999&created_at__month=12&created_at__day=31",
    "created_at__year=1",
    "created_at__year=99999",
    "created_at__year=-1",
    "created_at__year=2024&created_at__month=0",
    "created_at__year=2024&created_at__month=13",
    "created_at__year=2024&created_at__month=1&created_at__day=32",
    "created_at__year=２０２４",  # full-width digits: int() reads them, the page never makes them
])
def test_a_date_drill_down_out_of_range_is_refused(viewer, query):
    enqueue("a.job", queue="mail")
    assert viewer.get(f"{_changelist('job')}?{query}").status_code == 400


def test_dead_letters_drill_down_to_year_9999_is_refused(viewer):
    url = _changelist("deadletterjob")
    assert viewer.get(f"{url}?moved_to_dead_letter_at__year=9999").status_code == 400
    assert viewer.get(f"{url}?moved_to_dead_letter_at__year=2024").status_code == 200


def test_a_date_drill_down_in_range_still_works(viewer):
    enqueue("a.job", queue="mail")
    url = _changelist("job")
    for query in ("created_at__year=9998", "created_at__year=2",
                  "created_at__year=2024&created_at__month=12&created_at__day=31"):
        assert viewer.get(f"{url}?{query}").status_code == 200, query


@pytest.mark.parametrize("model", LISTS)
@pytest.mark.parametrize("parameter", ["q", "queue", "job_name", "task_name", "hostname",
                                       "status__exact"])
def test_a_nul_in_the_query_string_is_refused(viewer, model, parameter):
    """400 on every list, whether the parameter is a filter, a search or no lookup at all."""
    enqueue("a.job", queue="mail")
    assert viewer.get(f"{_changelist(model)}?{parameter}=a%00b").status_code == 400
    assert viewer.get(f"{_changelist(model)}?{parameter}%00=a").status_code == 400


def test_a_nul_in_an_all_matching_query_is_refused(admin_client):
    url = reverse("admin:soniq_django_job_matching", args=["retry-now"])
    assert admin_client.get(f"{url}?queue=a%00b").status_code == 400
    assert admin_client.post(f"{url}?q=a%00b").status_code == 400


@pytest.mark.parametrize("model", ["job", "deadletterjob", "queuesetting", "recurringjob",
                                   "worker"])
def test_an_object_id_with_a_nul_is_not_found(viewer, model):
    """Django's answer for an id that names no row: back to the index, saying so."""
    for view in ("change", "history"):
        url = reverse(f"admin:soniq_django_{model}_{view}", args=[quote("a\x00b")])
        response = viewer.get(url)
        assert response.status_code == 302 and response.url == reverse("admin:index"), view
        assert "doesn’t exist" in str(list(get_messages(response.wsgi_request))[0])


@pytest.mark.parametrize("key", ["1e999", "NaN", "Infinity", "x", "{}", '"a"', "[1]", "[1,2]",
                                 '["a"]', '["a","b","c"]', '[null,null]', '["a",1]',
                                 '["a\\u0000","b"]', '[["a"],"b"]'])
def test_a_registry_key_that_is_no_pair_of_strings_is_not_found(viewer, key):
    url = reverse("admin:soniq_django_taskregistration_change", args=[quote(key)])
    response = viewer.get(url)
    assert response.status_code == 302 and response.url == reverse("admin:index")


def _post_action(client, model: str, action: str, ids, *, across: bool = False):
    data = {"action": action, "index": 0, helpers.ACTION_CHECKBOX_NAME: [str(i) for i in ids]}
    if across:
        data["select_across"] = "1"
    response = client.post(_changelist(model), data)
    notes = [str(m) for m in get_messages(response.wsgi_request)]
    if response.status_code == 302:
        client.get(response.url)  # shows (and so clears) the messages, as a browser would
    return response, notes


@pytest.fixture
def small_cap(monkeypatch):
    """The cap at 3, on every soniq admin of the default site (the cap is the admin's)."""
    for model_admin in admin_site._registry.values():
        if hasattr(model_admin, "action_cap"):
            monkeypatch.setattr(model_admin, "action_cap", 3)
    return 3


def test_the_cap_is_the_documented_ten_thousand():
    assert ACTION_CAP == matching.MATCHING_CAP == 10_000
    for model in (Job, QueueSetting, RecurringJob):
        assert admin_site._registry[model].action_cap == 10_000


@pytest.mark.parametrize("action", ["cancel_selected", "retry_selected_now"])
def test_select_all_above_the_cap_changes_nothing(admin_client, small_cap, action):
    ids = [enqueue("a.job", queue="mail", run_at=dt.timedelta(days=1)) for _ in range(4)]
    response, notes = _post_action(admin_client, "job", action, ids[:1], across=True)
    assert response.status_code == 302
    assert notes == ["Nothing done: an action takes at most 3 rows in one request. Narrow the "
                     "list's filters, or use the management commands."]
    assert set(Job.objects.values_list("status", flat=True)) == {"queued"}
    assert Job.objects.filter(scheduled_at__isnull=True).count() == 0
    assert not LogEntry.objects.exists()
    # Filtered down to three, the same "Select all" runs.
    response = admin_client.post(f"{_changelist('job')}?q={ids[0]}", {
        "action": action, "index": 0, "select_across": "1",
        helpers.ACTION_CHECKBOX_NAME: [str(ids[0])]})
    assert response.status_code == 302 and LogEntry.objects.count() == 1


def test_ticking_more_rows_than_the_cap_changes_nothing(admin_client, small_cap):
    ids = [enqueue("a.job", queue="mail") for _ in range(4)]
    _, notes = _post_action(admin_client, "job", "cancel_selected", ids)
    assert notes[0].startswith("Nothing done: an action takes at most 3 rows")
    assert Job.objects.filter(status="cancelled").count() == 0
    _, notes = _post_action(admin_client, "job", "cancel_selected", ids[:3])
    assert notes == ["Cancelled 3 jobs."]


def test_select_all_of_queue_settings_and_schedules_is_capped_too(admin_client, small_cap):
    for name in "abcd":
        QueueSetting.objects.create(queue=name)
        RecurringJob.objects.create(job_name=f"shop.{name}", schedule_type="interval",
                                    schedule_value="60")
    _, notes = _post_action(admin_client, "queuesetting", "pause_selected", ["a"], across=True)
    assert notes[0].startswith("Nothing done") and not QueueSetting.objects.filter(
        paused=True).exists()
    first = RecurringJob.objects.first().pk
    _, notes = _post_action(admin_client, "recurringjob", "pause_selected", [first], across=True)
    assert notes[0].startswith("Nothing done") and not RecurringJob.objects.filter(
        status="paused").exists()
    _, notes = _post_action(admin_client, "queuesetting", "delete_selected", ["a"], across=True)
    assert notes[0].startswith("Nothing done") and QueueSetting.objects.count() == 4


def test_the_add_form_refuses_a_queue_name_longer_than_a_queues(admin_client):
    url = reverse("admin:soniq_django_queuesetting_add")
    page = admin_client.get(url).content.decode()
    assert 'maxlength="255"' in page
    for name, error in (("x" * 256, "Not a queue name: queue must be a non-empty string of at "
                                     "most 255 characters."),
                        ("a\x00b", "Null characters are not allowed.")):
        response = admin_client.post(url, {"queue": name, "paused": "on"})
        assert response.status_code == 200  # the form again, with the error
        assert response.context["adminform"].form.errors["queue"] == [error]
    assert not QueueSetting.objects.exists()
    response = admin_client.post(url, {"queue": "x" * 255, "paused": "on"})
    assert response.status_code == 302 and QueueSetting.objects.get().queue == "x" * 255


def test_pause_selected_skips_a_name_it_refuses_and_logs_the_others(admin_client):
    QueueSetting.objects.create(queue="a-mail")
    QueueSetting.objects.create(queue="b" + "x" * 300)  # written by SQL, say
    QueueSetting.objects.create(queue="c-reports")
    response, notes = _post_action(admin_client, "queuesetting", "pause_selected",
                                   ["a-mail", "b" + "x" * 300, "c-reports"])
    assert response.status_code == 302
    assert notes[0] == "Paused 2 queues."
    assert notes[1].startswith("1 queue not paused; queue must be a non-empty string")
    assert set(QueueSetting.objects.filter(paused=True).values_list("queue", flat=True)) == {
        "a-mail", "c-reports"}
    assert sorted(LogEntry.objects.values_list("object_id", flat=True)) == ["a-mail",
                                                                            "c-reports"]

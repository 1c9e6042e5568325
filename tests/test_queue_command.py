"""soniq_queue (pause, resume, status, sync) and what soniq_worker does with SONIQ["QUEUES"]."""

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from soniq_django import bulk_enqueue
from soniq_django.models import QueueSetting
from soniq_django.producer.request import JobRequest
from soniq_django.worker import Worker
from tests.support.workers import WorkerThread

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = io.StringIO()
    call_command("soniq_queue", *args, stdout=out)
    return out.getvalue()


def test_pause_and_resume_from_the_command_line():
    assert run("pause", "emails", "--by", "ops") == "Paused emails.\n"
    assert run("pause", "emails") == "emails was paused already.\n"
    assert QueueSetting.objects.get(queue="emails").paused_by == "ops"
    assert run("resume", "emails") == "Resumed emails.\n"
    assert run("resume", "emails") == "emails was not paused.\n"


def test_a_bad_queue_name_is_a_command_error():
    with pytest.raises(CommandError) as caught:
        run("pause", "x" * 256)
    assert "SONIQ_INVALID_OPTION" in str(caught.value)


@override_settings(SONIQ={"QUEUES": {"emails": {"concurrency": 5, "rate": "10/s"}}})
def test_status_shows_the_limits_that_apply_and_where_they_come_from():
    bulk_enqueue([JobRequest("flow.job", queue="emails") for _ in range(3)])
    QueueSetting.objects.create(queue="reports", rate_limit=2, rate_period=60, paused=True)
    out = run("status")
    assert "(database differs from SONIQ['QUEUES'])" in out  # not synced yet
    assert run("sync") == "Wrote SONIQ['QUEUES'] for: emails.\n"
    assert run("sync") == "soniq_queue_settings already holds SONIQ['QUEUES'].\n"
    lines = run("status").splitlines()
    assert lines[0].split() == ["queue", "state", "concurrency", "rate", "running", "queued"]
    assert lines[1].split() == ["emails", "active", "5", "10/s", "0", "3"]
    assert lines[2].split() == ["reports", "paused", "-", "2/m*", "0", "0"]
    assert "differs" not in "\n".join(lines)


def test_status_without_flow_control():
    assert run("status") == "(no queue has flow control)\n"


@override_settings(SONIQ={"QUEUES": {"emails": {"rate": "10/d"}}})
def test_the_worker_refuses_to_start_on_invalid_queue_settings():
    with pytest.raises(CommandError) as caught:
        call_command("soniq_worker", "--burst")
    assert str(caught.value).startswith("SONIQ['QUEUES'] is invalid (soniq.E011): ")
    assert not QueueSetting.objects.exists()


@pytest.mark.django_db(transaction=True)  # the worker thread writes on a connection of its own
@override_settings(SONIQ={"QUEUES": {"emails": {"concurrency": 2}}})
def test_a_worker_writes_the_setting_to_the_database_when_it_starts():
    assert WorkerThread(Worker(burst=True)).start().join() == 0
    row = QueueSetting.objects.get(queue="emails")
    assert (row.configured_concurrency, row.concurrency) == (2, None)


def test_limit_key_without_a_limit_is_a_command_error():
    from soniq_django.keys.models import KeyLimit

    with pytest.raises(CommandError) as caught:
        run("limit-key", "default", "tenant-*")
    assert "--concurrency or --rate" in str(caught.value)
    assert not KeyLimit.objects.exists()  # nothing said "Limited" while limiting nothing

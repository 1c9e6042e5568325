"""soniq_enqueue, soniq_status and the --help of every command."""

import io
import json
import uuid

import pytest
from django.core.management import call_command, get_commands
from django.core.management.base import CommandError

from soniq_django import enqueue
from soniq_django.models import DeadLetterJob, Job

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_enqueue_command_prints_the_id_and_stores_every_option():
    out = run("soniq_enqueue", "billing.send_invoice", "--args", '{"order_id": 5}', "--queue",
              "billing", "--priority", "7", "--run-at", "2030-01-01T09:00:00+01:00",
              "--dedup-key", "inv-5", "--max-attempts", "2")
    row = Job.objects.get(id=uuid.UUID(out.strip()))
    assert (row.job_name, row.args, row.queue, row.priority, row.dedup_key, row.max_attempts) == (
        "billing.send_invoice", {"order_id": 5}, "billing", 7, "inv-5", 2,
    )
    assert row.scheduled_at.isoformat() == "2030-01-01T08:00:00+00:00"
    assert run("soniq_enqueue", "other.job", "--dedup-key", "inv-5").strip() == out.strip()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["Bad Name"], "SONIQ_INVALID_TASK_NAME"),
        (["a.b", "--args", "[1]"], "SONIQ_TASK_ARGS_INVALID"),
        (["a.b", "--args", "{nope"], "not valid JSON"),
        (["a.b", "--run-at", "2030-01-01T09:00:00"], "time zone"),
        (["a.b", "--max-attempts", "0"], "SONIQ_INVALID_MAX_ATTEMPTS"),
    ],
)
def test_enqueue_command_errors(args, needle):
    with pytest.raises(CommandError) as caught:
        run("soniq_enqueue", *args)
    assert needle in str(caught.value)
    assert not Job.objects.exists()


def test_enqueue_command_never_echoes_args():
    with pytest.raises(CommandError) as caught:
        run("soniq_enqueue", "a.b", "--args", '{"secret": "hunter2", "x": 1e400}')
    assert "hunter2" not in str(caught.value)


def test_status_table_and_json():
    enqueue("a.one", queue="mail")
    enqueue("a.two", queue="mail")
    enqueue("a.three", queue="billing")
    DeadLetterJob.objects.create(id=uuid.uuid4(), job_name="a.dead", queue="billing",
                                 dead_letter_reason="permanent_failure")
    table = run("soniq_status")
    assert "mail" in table and "billing" in table and "permanent_failure=1" in table
    data = json.loads(run("soniq_status", "--json"))
    assert data["queues"]["mail"]["queued"] == 2
    assert data["queues"]["billing"]["dead_letter"] == 1
    assert data["dead_letters_by_reason"] == {"permanent_failure": 1}
    assert data["oldest_queued_seconds"]["mail"] >= 0


def test_status_of_an_empty_database():
    assert "(no jobs)" in run("soniq_status")


def test_every_soniq_command_has_help_a_newcomer_understands():
    names = [name for name, app in get_commands().items() if app == "soniq_django"]
    assert {"soniq_worker", "soniq_enqueue", "soniq_status", "soniq_grant"} <= set(names)
    for name in names:
        from django.core.management import load_command_class

        command = load_command_class("soniq_django", name)
        assert len(command.help) > 40, name
        parser = command.create_parser("manage.py", name)
        assert parser.format_help()

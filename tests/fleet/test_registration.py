"""A worker's registration: soniq_register_worker / soniq_worker_heartbeat, and their SQLite twin.

``registration.register_worker`` and ``registration.beat`` call the SQL
functions on PostgreSQL (what a worker in any language calls) and run their
twin on SQLite, so every behaviour here is checked on both databases. A
registered foreign worker is live on the same rule as a Python one: a Python
worker defers, never dead-letters, a job whose name only it knows.
"""

import logging
import uuid

import pytest
from django.urls import reverse

from soniq_django import enqueue
from soniq_django.models import DeadLetterJob, Job, TaskRegistration, Worker as WorkerRow
from soniq_django.worker import registration
from tests.support.workers import run_burst, soniq

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fast")]

LABEL = "node worker 1.2"


def foreign(names, *, queues=None, limits=None, host="node-host", pid=31337) -> str:
    """A worker of another language, registered as it would register itself."""
    worker_id = str(uuid.uuid4())
    registration.register_worker("default", worker_id, queues, names, host=host, pid=pid,
                                 label=LABEL, max_attempts=limits)
    return worker_id


def names_of(worker_id: str) -> dict:
    return dict(TaskRegistration.objects.filter(worker_id=worker_id)
                .values_list("task_name", "max_attempts"))


def test_a_registration_writes_the_row_and_exactly_the_names_given():
    worker_id = foreign(["node.a", "node.b"], queues=["q1"], limits=[7, None])
    row = WorkerRow.objects.get(id=worker_id)
    assert (row.hostname, row.pid, row.queues, row.status, row.version, row.concurrency) == (
        "node-host", 31337, ["q1"], "active", LABEL, 1)
    assert names_of(worker_id) == {"node.a": 7, "node.b": None}
    # Again, with fewer names: the row revived, the names replaced.
    registration.register_worker("default", worker_id, None, ["node.a"], host="node-host",
                                 pid=31337, label="node worker 1.3", concurrency=4)
    row = WorkerRow.objects.get(id=worker_id)
    assert (row.queues, row.version, row.concurrency) == ([], "node worker 1.3", 4)
    assert names_of(worker_id) == {"node.a": None}


def test_a_registration_of_the_same_host_and_pid_replaces_the_older_row():
    older = foreign(["node.a"])
    newer = foreign(["node.b"])
    assert list(WorkerRow.objects.values_list("id", flat=True)) == [uuid.UUID(newer)]
    assert names_of(older) == {} and names_of(newer) == {"node.b": None}
    # The replaced worker hears it at its next heartbeat: False, register again.
    assert registration.beat("default", older) is False


def test_the_heartbeat_answers_whether_the_row_is_there_and_not_stopped():
    worker_id = foreign(["node.a"])
    first = WorkerRow.objects.get(id=worker_id).last_heartbeat
    assert registration.beat("default", worker_id, "running") is True
    assert WorkerRow.objects.get(id=worker_id).last_heartbeat >= first
    assert registration.beat("default", worker_id, "stopping") is True
    assert WorkerRow.objects.get(id=worker_id).status == "stopping"
    registration.unregister("default", worker_id)
    assert WorkerRow.objects.get(id=worker_id).status == "stopped"
    assert registration.beat("default", worker_id, "running") is False  # register again
    assert WorkerRow.objects.get(id=worker_id).status == "stopped"
    assert registration.beat("default", str(uuid.uuid4())) is False  # no row at all


def test_a_python_worker_defers_a_job_only_a_live_foreign_worker_knows(settings):
    soniq(settings, UNKNOWN_JOB_GRACE_SECONDS=0)  # without a knower: dead letter at once
    node = foreign(["fleet.node_only"])
    job_id = enqueue("fleet.node_only", {"n": 1})
    assert run_burst() == 0
    row = Job.objects.get(id=job_id)
    assert (row.status, row.attempts) == ("queued", 0)
    assert "for the 1 live worker(s) that registered it" in row.last_error
    assert not DeadLetterJob.objects.exists()
    # Once the foreign worker said it stopped, nobody knows the name.
    registration.unregister("default", node)
    Job.objects.filter(id=job_id).update(scheduled_at=None)
    assert run_burst() == 0
    assert DeadLetterJob.objects.get(id=job_id).dead_letter_reason == "job_not_found"


def test_a_foreign_worker_of_another_queue_does_not_count(settings):
    soniq(settings, UNKNOWN_JOB_GRACE_SECONDS=0)
    foreign(["fleet.node_only"], queues=["elsewhere"])
    job_id = enqueue("fleet.node_only", {"n": 1})
    assert run_burst() == 0
    assert DeadLetterJob.objects.get(id=job_id).dead_letter_reason == "job_not_found"


def test_the_python_worker_registers_through_the_same_function():
    from soniq_django.registry import registered_handlers
    from soniq_django.worker import Worker
    from tests.support.workers import WorkerThread

    worker = Worker(burst=True)
    assert WorkerThread(worker).start().join() == 0
    handlers = registered_handlers()
    assert names_of(worker.worker_id) == {
        name: handler.max_attempts for name, handler in handlers.items()}
    assert WorkerRow.objects.get(id=worker.worker_id).status == "stopped"


def test_the_dashboard_shows_a_foreign_workers_label(client, django_user_model):
    foreign(["fleet.node_only"], queues=["fleet"])
    client.force_login(django_user_model.objects.create_superuser(
        "admin", "admin@example.com", password=None))
    html = client.get(reverse("admin:soniq_django_dashboard")).content.decode()
    assert LABEL in html and "node-host" in html and "31337" in html


def test_a_worker_whose_row_was_replaced_registers_again_at_its_next_beat(caplog):
    from soniq_django.worker import Worker
    from tests.support.workers import WorkerThread, wait_until

    caplog.set_level(logging.WARNING, logger="soniq_django.worker")
    again = "its row was gone or stopped; registering again"
    worker = Worker(queues=["fleet"])
    with WorkerThread(worker) as running:
        wait_until(lambda: WorkerRow.objects.filter(id=worker.worker_id, status="active").exists(),
                   10, "the worker row")
        assert not any(again in record.getMessage() for record in caplog.records)
        # A registration of another worker under this host and pid replaces its row. The
        # beat (every 0.1 s) may find it gone before the next line could see it gone: the
        # log line, not a read of the table, says it did.
        row = WorkerRow.objects.get(id=worker.worker_id)
        other = foreign([], host=row.hostname, pid=row.pid)
        wait_until(lambda: any(again in record.getMessage() for record in caplog.records)
                   and WorkerRow.objects.filter(id=worker.worker_id, status="active").exists(),
                   10, "the worker to register again")
        assert names_of(worker.worker_id)  # its handlers too
        assert running.stop() == 0
    assert not WorkerRow.objects.filter(id=other).exists()  # replaced in turn

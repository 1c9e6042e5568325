"""What the separate-jobs-database project does, one scenario per run.

``python -m tests.routers.scenarios <name> [arg]`` (with
``DJANGO_SETTINGS_MODULE=tests.routers.settings``) runs one scenario against
the project's real databases and prints one line ``RESULT <json>`` of what
it observed; tests/routers/test_separate_jobs_database.py asserts on it.
"Seen" always means committed: rows are looked for through ``jobs_replica``,
a connection of its own that never shares a transaction with the scenario.
A scenario that raises prints its exception's class and message instead.
"""

import datetime as dt
import io
import json
import sys
import uuid
import warnings

import django


def _seen(job_id) -> bool:
    """Whether a committed soniq_jobs row has this id (read through jobs_replica)."""
    from soniq_django.models import Job

    return Job.objects.using("jobs_replica").filter(id=job_id).exists()


class _Rollback(Exception):
    pass


def on_commit() -> dict:
    """enqueue_on_commit (and the Tasks backend's) against transactions on default and jobs."""
    from django.db import transaction

    from tests.testapp.jobs import add

    seen = {}
    with transaction.atomic():  # default: the application's database
        job = add.enqueue_on_commit(a=1)
        seen["default: inside the block"] = _seen(job)
    seen["default: after its commit"] = _seen(job)

    try:
        with transaction.atomic():
            job = add.enqueue_on_commit(a=2)
            raise _Rollback
    except _Rollback:
        pass
    seen["default rolled back"] = _seen(job)

    with transaction.atomic():
        try:
            with transaction.atomic():  # a savepoint on default
                job = add.enqueue_on_commit(a=3)
                raise _Rollback
        except _Rollback:
            pass
    seen["savepoint on default rolled back, default committed"] = _seen(job)

    with transaction.atomic():
        with transaction.atomic(using="jobs"):
            job = add.enqueue_on_commit(a=4)
        seen["both open: after jobs committed"] = _seen(job)
    seen["both open: after default committed too"] = _seen(job)

    try:
        with transaction.atomic():
            with transaction.atomic(using="jobs"):
                job = add.enqueue_on_commit(a=5)
            raise _Rollback
    except _Rollback:
        pass
    seen["both open: jobs committed, default rolled back"] = _seen(job)

    with transaction.atomic(using="jobs"):
        job = add.enqueue_on_commit(a=6)
        seen["jobs only: inside the block"] = _seen(job)
    seen["jobs only: after its commit"] = _seen(job)

    seen["no transaction: at once"] = _seen(add.enqueue_on_commit(a=7))
    seen.update(_in_a_test_case())
    seen.update(_tasks_on_commit())
    return seen


def _in_a_test_case() -> dict:
    """As in a TestCase: both aliases in blocks that never commit, callbacks captured."""
    from django.db import transaction
    from django.test import TestCase

    from soniq_django.models import Job
    from tests.testapp.jobs import add

    seen = {}
    try:
        with transaction.atomic(), transaction.atomic(using="jobs"):
            with TestCase.captureOnCommitCallbacks(using="default", execute=True):
                job = add.enqueue_on_commit(a=8)
            seen["test case: captured on default only"] = (
                Job.objects.using("jobs").filter(id=job).exists())
            with TestCase.captureOnCommitCallbacks(using="default", execute=True), \
                    TestCase.captureOnCommitCallbacks(using="jobs", execute=True):
                job = add.enqueue_on_commit(a=9)
            seen["test case: captured on both"] = Job.objects.using("jobs").filter(id=job).exists()
            raise _Rollback
    except _Rollback:
        pass
    return seen


def _tasks_on_commit() -> dict:
    from django.db import transaction

    from soniq_django.tasks_backend import SoniqTaskBackend
    from tests.testapp import tasks

    backend = SoniqTaskBackend("on_commit", {"QUEUES": ["default"],
                                             "OPTIONS": {"enqueue_on_commit": True}})
    seen = {}
    with transaction.atomic():
        result = backend.enqueue(tasks.add, (1, 2), {})
        seen["tasks: inside the block on default"] = _seen(result.id)
    seen["tasks: after the commit of default"] = _seen(result.id)
    try:
        with transaction.atomic():
            result = backend.enqueue(tasks.add, (3, 4), {})
            raise _Rollback
    except _Rollback:
        pass
    seen["tasks: default rolled back"] = _seen(result.id)
    return seen


def enqueue_warnings() -> dict:
    """Which immediate enqueues warn: where the warning points, and the message's aliases."""
    from django.db import transaction

    from soniq_django import bulk_enqueue, enqueue
    from soniq_django.owned import JobRequest
    from soniq_django.tasks_backend import SoniqTaskBackend
    from tests.testapp import tasks
    from tests.testapp.jobs import add

    immediate = SoniqTaskBackend("immediate_rows", {"QUEUES": ["default"], "OPTIONS": {}})
    calls = {
        "enqueue": lambda: enqueue("tests.add", {"a": 1}),
        "handler.enqueue": lambda: add.enqueue(a=1),
        "configure().enqueue": lambda: add.configure(priority=5).enqueue(a=1),
        "bulk_enqueue": lambda: bulk_enqueue([JobRequest("tests.add", {"a": 1})]),
        "tasks backend": lambda: immediate.enqueue(tasks.add, (1, 2), {}),
    }
    where = {
        "default open": [transaction.atomic()],
        "default and jobs open": [transaction.atomic(), transaction.atomic(using="jobs")],
        "jobs open": [transaction.atomic(using="jobs")],
        "none open": [],
    }
    report = {}
    for place, blocks in where.items():
        for name, call in calls.items():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for block in blocks:
                    block.__enter__()
                try:
                    call()
                finally:
                    for block in reversed(blocks):
                        block.__exit__(None, None, None)
            report[f"{place}: {name}"] = [
                {"category": w.category.__name__, "file": w.filename.rsplit("/", 1)[-1],
                 "names_default": "'default'" in str(w.message),
                 "names_jobs": "'jobs'" in str(w.message)}
                for w in caught if "soniq" in str(w.message) or "job" in str(w.message)]
    return report


def reads() -> dict:
    """get_job and the Tasks backend's get_result read through the routers' read alias."""
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    from soniq_django import enqueue, get_job
    from soniq_django.tasks_backend import SoniqTaskBackend
    from tests.testapp import tasks

    job = enqueue("tests.add", {"a": 1})
    result = tasks.add.enqueue(1, 2)
    backend = SoniqTaskBackend("reader", {"QUEUES": ["default"], "OPTIONS": {}})
    with CaptureQueriesContext(connections["jobs_replica"]) as replica, \
            CaptureQueriesContext(connections["jobs"]) as primary:
        info = get_job(job)
        fetched = backend.get_result(result.id)
    return {"status": info.status, "task status": str(fetched.status),
            "queries on jobs_replica": len(replica) > 0, "queries on jobs": len(primary)}


def place_order(fail: str) -> dict:
    """POST the example shop's order view (enqueue_on_commit inside atomic() on default)."""
    from django.test import Client

    from example_project.shop.models import Order
    from soniq_django.models import Job

    def receipts() -> int:
        return Job.objects.using("jobs_replica").filter(job_name="shop.send_receipt").count()

    before_orders, before_jobs = Order.objects.count(), receipts()
    response = Client().post("/orders/", {"email": "buyer@example.com", "amount_cents": "1250",
                                          "fail": fail})
    body = response.json()
    return {"status": response.status_code, "job_id": body.get("job_id"),
            "order_id": body.get("order_id"),
            "new orders": Order.objects.count() - before_orders,
            "new receipt jobs": receipts() - before_jobs}


def admin() -> dict:
    """The admin lists from jobs_replica; each action writes through the write alias."""
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.urls import reverse

    from soniq_django.models import DeadLetterJob, Job, RecurringJob

    rows = _admin_rows()
    user = get_user_model().objects.create_superuser(f"admin-{uuid.uuid4().hex[:8]}",
                                                     "admin@example.com", password=None)
    client = Client()
    client.force_login(user)
    report = {}
    for model in ("job", "deadletterjob", "recurringjob", "worker", "taskregistration"):
        report[f"list {model}"] = client.get(
            reverse(f"admin:soniq_django_{model}_changelist")).status_code
    report["dashboard"] = client.get(reverse("admin:soniq_django_dashboard")).status_code
    actions = [("job", "cancel_selected", rows["queued"]),
               ("job", "retry_selected_now", rows["later"]),
               ("job", "delete_selected_finished", rows["done"]),
               ("deadletterjob", "replay_selected", rows["dead"]),
               ("recurringjob", "pause_selected", rows["schedule"])]
    for model, action, pk in actions:
        try:
            response = client.post(reverse(f"admin:soniq_django_{model}_changelist"), {
                "action": action, "_selected_action": [str(pk)], "index": 0})
            report[action] = response.status_code
        except Exception as error:  # the admin's 500, raised by the test client
            report[action] = type(error).__name__
    jobs = Job.objects.using("jobs")
    report["after"] = {
        "queued job": jobs.filter(id=rows["queued"]).values_list("status", flat=True).first(),
        "later job is due": jobs.filter(id=rows["later"],
                                        scheduled_at__lte=dt.datetime.now(dt.UTC)).exists(),
        "done job deleted": not jobs.filter(id=rows["done"]).exists(),
        "dead letter replayed": jobs.filter(id=rows["dead"], status="queued").exists()
        and DeadLetterJob.objects.using("jobs").get(id=rows["dead"]).resurrection_count == 1,
        "schedule": RecurringJob.objects.using("jobs").get(id=rows["schedule"]).status,
    }
    # The admin log is an app of default: its entries go there, on the rows
    # of jobs by their ids (text), with who did it.
    from django.contrib.admin.models import LogEntry

    report["log"] = sorted(
        [entry.user_id == user.pk, entry.content_type.model, entry.object_id,
         entry.action_flag, entry.change_message]
        for entry in LogEntry.objects.using("default").select_related("content_type"))
    report["ids"] = {name: str(pk) for name, pk in rows.items()}
    return report


def _admin_rows() -> dict:
    from django.utils import timezone

    from soniq_django import enqueue
    from soniq_django.models import DeadLetterJob, Job, RecurringJob

    now = timezone.now()
    done = enqueue("tests.add", {"a": 1}, queue="admin-done")
    Job.objects.using("jobs").filter(id=done).update(status="done", expires_at=now)
    dead = DeadLetterJob.objects.using("jobs").create(
        id=uuid.uuid4(), job_name="tests.add", args={"a": 1}, queue="admin-dead",
        dead_letter_reason="permanent_failure", last_error="boom", moved_to_dead_letter_at=now)
    schedule = RecurringJob.objects.using("jobs").create(
        job_name=f"tests.nightly_{uuid.uuid4().hex[:8]}", schedule_type="cron",
        schedule_value="0 3 * * *")
    return {
        "queued": enqueue("tests.add", {"a": 1}, queue="admin-queued"),
        "later": enqueue("tests.add", {"a": 1}, queue="admin-later",
                         run_at=now + dt.timedelta(hours=1)),
        "done": done, "dead": dead.id, "schedule": schedule.id,
    }


def commands(role: str) -> dict:
    """Every soniq command without --database: each must find soniq's tables (in jobs)."""
    from django.core.management import call_command

    runs = {
        "soniq_status": [],
        "soniq_enqueue": ["tests.add", "--args", '{"a": 1}'],
        "soniq_scheduler": ["--once"],
        "soniq_purge": [],
        "soniq_replay": ["--all", "--dry-run"],
        "soniq_check_schema": [],
        "soniq_retire_submissions": ["--older-than", "1"],
    }
    if role:
        runs["soniq_grant"] = [role]
    report = {}
    for name, args in runs.items():
        try:
            call_command(name, *args, stdout=io.StringIO(), stderr=io.StringIO())
            report[name] = "ok"
        except Exception as error:
            report[name] = type(error).__name__
    return report


SCENARIOS = {"on_commit": on_commit, "enqueue_warnings": enqueue_warnings, "reads": reads,
             "place_order": place_order, "admin": admin, "commands": commands}


def main(argv: list[str]) -> None:
    django.setup()
    name, *args = argv
    try:
        outcome = SCENARIOS[name](*args)
    except Exception as error:
        outcome = {"raised": type(error).__name__, "message": str(error)[:500]}
    print("RESULT " + json.dumps(outcome, default=str))


if __name__ == "__main__":
    main(sys.argv[1:])

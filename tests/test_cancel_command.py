"""manage.py soniq_cancel: by id (whole or the admin's short form) and/or queue and name."""

import datetime as dt
import io
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from soniq_django import enqueue
from soniq_django.models import Job
from soniq_django.owned import OwnedJobSource
from tests.support.owned import nonce
from tests.support.worker_processes import database_url

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[1]
SECRET = "s3cret-card-4242"


def queued(prefix: str = "", **options) -> uuid.UUID:
    """A queued job whose id starts with ``prefix`` (hex digits)."""
    job_id = uuid.UUID(prefix + uuid.uuid4().hex[len(prefix):])
    options.setdefault("queue", "billing")
    return enqueue("billing.send_invoice", {"card": SECRET}, job_id=job_id, **options)


def running(queue: str = "billing") -> uuid.UUID:
    """A job claimed by a worker that still holds its lease (make it first in its queue)."""
    job_id = queued(queue=queue)
    claimed = OwnedJobSource().claim_next_owned("worker-1", claim_token=nonce(), queues=[queue])
    assert claimed.job_id == job_id
    return job_id


def cancel(*argv) -> list[str]:
    out = io.StringIO()
    call_command("soniq_cancel", *argv, stdout=out)
    text = out.getvalue()
    assert SECRET not in text
    return text.splitlines()


def status(job_id) -> tuple[str, bool]:
    return Job.objects.values_list("status", "cancel_requested").get(id=job_id)


def test_a_queued_job_is_cancelled_by_the_short_id_the_admin_shows():
    job_id, other = queued("3f9a1b2c"), queued("77aa0000")
    assert cancel("3f9a1b2c") == [
        f"cancelled {job_id} billing.send_invoice (queue billing)",
        "Cancelled 1 jobs at once; asked the workers of 0 running jobs to stop; "
        "skipped 0 finished ones.",
    ]
    assert status(job_id) == ("cancelled", False) and status(other) == ("queued", False)


def test_a_running_job_is_asked_to_stop_as_the_admin_does():
    job_id = running()
    assert cancel(str(job_id).upper())[0] == (
        f"asked the worker running {job_id} billing.send_invoice (queue billing) to stop")
    assert status(job_id) == ("processing", True)


def test_queue_and_name_choose_every_queued_scheduled_and_running_job_they_match():
    busy = running(queue="mail")
    later = queued(queue="mail", run_at=timezone.now() + dt.timedelta(days=1))
    now = queued(queue="mail")
    elsewhere = queued(queue="billing")
    other_name = enqueue("mail.digest", {}, queue="mail")
    lines = cancel("--queue", "mail", "--name", "billing.send_invoice")
    assert lines[-1] == ("Cancelled 2 jobs at once; asked the workers of 1 running jobs to stop; "
                         "skipped 0 finished ones.")
    assert {status(later), status(now), status(busy)} == {
        ("cancelled", False), ("processing", True)}
    assert status(elsewhere)[0] == status(other_name)[0] == "queued"
    cancel("--name", "mail.digest")
    assert status(other_name)[0] == "cancelled" and status(elsewhere)[0] == "queued"


def test_ids_are_looked_up_among_the_jobs_the_filters_choose():
    job_id = queued("3f9a1b2c", queue="billing")
    with pytest.raises(CommandError, match="no job in queue 'mail' has the id 3f9a1b2c"):
        cancel("3f9a1b2c", "--queue", "mail")
    assert status(job_id)[0] == "queued"


def test_dry_run_says_what_it_would_do_and_changes_nothing():
    busy = running()
    job_id = queued()
    lines = cancel("--queue", "billing", "--dry-run")
    assert sorted(lines[:-1]) == sorted([
        f"would cancel {job_id} billing.send_invoice (queue billing)",
        f"would ask the worker running {busy} billing.send_invoice (queue billing) to stop",
    ])
    assert lines[-1].startswith("Would cancel 1 jobs at once; would ask the workers of 1 ")
    assert status(job_id) == ("queued", False) and status(busy) == ("processing", False)


@pytest.mark.parametrize(("argv", "needle"), [
    (["3f9a1b2c"], "3f9a1b2c is the start of 2 jobs' ids: give more of the id"),
    (["0badc0de"], "no job has the id 0badc0de"),
    (["3f9a1b"], "'3f9a1b' is neither a job id nor its first 8 or more hex digits"),
])
def test_ids_that_are_not_exactly_one_job_change_nothing(argv, needle):
    first, second = queued("3f9a1b2c0"), queued("3f9a1b2c1")
    good = queued("12345678")
    with pytest.raises(CommandError) as caught:
        cancel(str(good), *argv)
    assert needle in str(caught.value) and "Nothing was changed." in str(caught.value)
    assert {status(job_id)[0] for job_id in (first, second, good)} == {"queued"}


def test_nothing_to_cancel_is_an_error():
    with pytest.raises(CommandError, match="Say which jobs to cancel"):
        cancel()
    with pytest.raises(CommandError, match="No job was cancelled: nothing queued or running"):
        cancel("--queue", "empty")
    done = queued()
    cancel(str(done))
    out = io.StringIO()
    with pytest.raises(CommandError, match="No job was cancelled"):
        call_command("soniq_cancel", str(done), stdout=out)
    assert out.getvalue().splitlines()[0] == (
        f"skipped {done} billing.send_invoice (queue billing): already cancelled")


def test_the_exit_status_is_not_zero_when_nothing_matched():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.worker_settings",
           "SONIQ_WORKER_DATABASE_URL": database_url(connection), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "manage.py", "soniq_cancel", "--queue", "nothing"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "No job was cancelled: nothing queued or running matched." in done.stderr

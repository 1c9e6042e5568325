"""A job's timeline on its admin page and its dead letter's, on both databases.

The jobs go through the real claims, failures, completions and replays;
the timeline must show what the rows record, in order, and say what they
do not record.
"""

import html as htmllib
import re

import pytest
from django.urls import reverse
from django.utils import timezone

from soniq_django import enqueue, replay
from soniq_django.admin.timeline import dead_letter_events, error_summary, job_events
from soniq_django.models import DeadLetterJob, Job
from soniq_django.owned import OwnedJobSource
from tests.support.owned import nonce, rewrite

pytestmark = pytest.mark.django_db

TRACEBACK = ('Traceback (most recent call last):\n  File "x.py", line 1, in run\n'
             'ValueError: card <script>alert(1)</script> declined\n')
DECLINED = "ValueError: card <script>alert(1)</script> declined"


def _claim(worker: str, queue: str):
    claimed = OwnedJobSource().claim_next_owned(worker, claim_token=nonce(), queues=[queue])
    assert claimed is not None
    return claimed


def _due_now(job_id) -> None:
    rewrite(job_id, scheduled_at=timezone.now())


def _timeline(client, url: str) -> list[tuple[str, str, str]]:
    """The timeline's rows as (when, event, details) text."""
    html = client.get(url).content.decode()
    table = html.split('<table class="soniq-timeline">')[1].split("</table>")[0]
    body = table.split("<tbody>")[1]
    rows = re.findall(r"<tr><td>(.*?)</td><th scope=\"row\">(.*?)</th><td>(.*?)</td></tr>", body,
                      re.S)
    return [tuple(htmllib.unescape(re.sub(r"<[^>]+>", "", cell)).strip() for cell in row)
            for row in rows]


def _local(value) -> str:
    return timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S")


def test_a_job_that_failed_once_then_completed(admin_client):
    job_id = enqueue("billing.charge", {"amount": 5}, queue="billing", producer_id="shop")
    source = OwnedJobSource()
    assert source.fail_owned(_claim("worker-a", "billing").claim_fence, TRACEBACK, retry=True)
    _due_now(job_id)
    assert source.complete_owned(_claim("worker-b", "billing").claim_fence, {"ok": True})
    job = Job.objects.get(id=job_id)
    rows = _timeline(admin_client, reverse("admin:soniq_django_job_change", args=[job_id]))
    events = [event for _, event, _ in rows]
    assert events[:3] == ["Enqueued", "1 earlier claim", "Claimed: attempt 2"]
    assert events[-2:] == ["Completed", "Row expires"]
    assert rows[0] == (_local(job.created_at), "Enqueued",
                       "queue billing, priority 100, by producer shop")
    assert rows[1][0] == "not recorded" and "generations 1 to 1" in rows[1][2]
    assert rows[2][2].startswith("worker worker-b, generation 2")
    assert rows[-2] == (_local(job.updated_at), "Completed", "attempt 2")
    assert rows[-1][0] == _local(job.expires_at)
    assert job.last_error == TRACEBACK  # a completion keeps the error of the attempt before
    assert rows[3] == ("not recorded", "An earlier attempt failed", DECLINED)


def test_a_job_waiting_for_its_retry_and_a_running_one(admin_client):
    waiting = enqueue("billing.charge", queue="billing")
    assert OwnedJobSource().fail_owned(_claim("worker-a", "billing").claim_fence, TRACEBACK,
                                       retry=True)
    job = Job.objects.get(id=waiting)
    rows = _timeline(admin_client, reverse("admin:soniq_django_job_change", args=[waiting]))
    assert [event for _, event, _ in rows] == [
        "Enqueued", "Claimed: attempt 1", "Attempt 1 failed", "Due again (retry)"]
    assert rows[2] == (_local(job.updated_at), "Attempt 1 failed",
                       DECLINED)
    assert rows[3][0] == _local(job.scheduled_at) and job.scheduled_at > job.updated_at
    page = admin_client.get(reverse("admin:soniq_django_job_change", args=[waiting]))
    timeline = page.content.decode().split('<table class="soniq-timeline">')[1]
    assert "card &lt;script&gt;alert(1)" in timeline and "<script>alert" not in timeline

    running = enqueue("reports.build", queue="reports")
    _claim("worker-c", "reports")
    job = Job.objects.get(id=running)
    page = admin_client.get(reverse("admin:soniq_django_job_change", args=[running]))
    assert job.claim_token not in page.content.decode()
    rows = _timeline(admin_client, reverse("admin:soniq_django_job_change", args=[running]))
    assert rows[-1] == (_local(job.updated_at), "Running",
                        "last written (claim or heartbeat); lease until "
                        f"{_local(job.lease_expires_at)}")

    fresh = enqueue("reports.build", queue="reports")
    rows = _timeline(admin_client, reverse("admin:soniq_django_job_change", args=[fresh]))
    assert [event for _, event, _ in rows] == ["Enqueued", "Waiting to be claimed"]


def test_a_dead_letter_and_its_replay(admin_client):
    job_id = enqueue("billing.charge", queue="billing")
    assert OwnedJobSource().fail_owned(_claim("worker-a", "billing").claim_fence, TRACEBACK,
                                       retry=False)
    dead = DeadLetterJob.objects.get(id=job_id)
    dead_url = reverse("admin:soniq_django_deadletterjob_change", args=[job_id])
    rows = _timeline(admin_client, dead_url)
    assert rows == [
        (_local(dead.original_created_at), "Enqueued", "queue billing"),
        ("not recorded", "1 attempt",
         "the dead-letter row keeps no worker, generation or claim time"),
        (_local(dead.moved_to_dead_letter_at), "Dead-lettered (permanent_failure)",
         DECLINED),
    ]

    assert replay.replay_dead_letters(ids=[job_id]).replayed == (job_id,)
    dead.refresh_from_db()
    rows = _timeline(admin_client, dead_url)
    assert rows[-1] == (_local(dead.last_resurrection_at), "Replayed into the queue",
                        "the job's page has what happened since")
    job_url = reverse("admin:soniq_django_job_change", args=[job_id])
    assert f'<a href="{job_url}">The job\'s timeline since its replay.</a>' in (
        admin_client.get(dead_url).content.decode())

    # The replayed job: its earlier run, from the dead letter; its claims count from the replay.
    _claim("worker-b", "billing")
    rows = _timeline(admin_client, job_url)
    assert [event for _, event, _ in rows] == [
        "Enqueued", "Dead-lettered (permanent_failure)", "Replayed from the dead letters",
        "Claimed: attempt 1", "Running"]
    assert rows[2][2] == "replay 1; attempts start again at 0"
    assert rows[3][2].startswith(f"worker worker-b, generation {2**32 + 1}")


def test_a_replay_that_ran_and_expired_says_so():
    dead = DeadLetterJob(id=None, job_name="a", queue="q", attempts=3, dead_letter_reason="x",
                         moved_to_dead_letter_at=timezone.now(), resurrection_count=2,
                         original_created_at=timezone.now())
    dead.last_resurrection_at = dead.moved_to_dead_letter_at
    events = dead_letter_events(dead, job_is_live=False)
    assert [e.what for e in events] == ["Enqueued", "1 earlier replay", "3 attempts",
                                        "Dead-lettered (x)", "Replayed into the queue"]
    assert events[-1].detail == "no longer in soniq_jobs: it finished and its row expired"


def test_a_job_claimed_by_soniqs_own_worker_has_attempts_but_no_generation():
    job = Job(job_name="a", queue="q", status="done", attempts=1, claim_generation=0,
              created_at=timezone.now(), updated_at=timezone.now())
    assert [e.what for e in job_events(job)] == ["Enqueued", "Claimed: attempt 1", "Completed"]
    assert job_events(job)[1].detail.startswith("worker not recorded, generation 0")


def test_error_summary_is_the_last_line_cut():
    assert error_summary(TRACEBACK) == "ValueError: card <script>alert(1)</script> declined"
    assert error_summary(None) == "" and error_summary("\n \n") == ""
    assert error_summary("x" * 400) == "x" * 300 + "…"

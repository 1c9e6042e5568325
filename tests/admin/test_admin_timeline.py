"""A job's timeline on its admin page and its dead letter's, on both databases.

The jobs go through the real claims, failures, completions and replays;
the timeline shows each attempt (recorded, or the job's own row), in order,
and says what was not recorded.
"""

import html as htmllib
import re

import pytest
from django.urls import reverse
from django.utils import timezone

from soniq_django import enqueue, replay
from soniq_django.admin.timeline import dead_letter_events, error_summary, job_events
from soniq_django.models import DeadLetterJob, Job, JobAttempt, Worker
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
    failed = JobAttempt.objects.get(job_id=job_id)
    _due_now(job_id)
    assert source.complete_owned(_claim("worker-b", "billing").claim_fence, {"ok": True})
    job = Job.objects.get(id=job_id)
    rows = _timeline(admin_client, reverse("admin:soniq_django_job_change", args=[job_id]))
    assert [event for _, event, _ in rows] == [
        "Enqueued", "Attempt 1: failed (retried)", "Attempt 2: completed", "Row expires"]
    assert rows[0] == (_local(job.created_at), "Enqueued",
                       "queue billing, priority 100, by producer shop")
    assert rows[1][0] == _local(failed.claimed_at)
    assert rows[1][2].startswith("owner worker-a; ran ")
    assert rows[1][2].endswith(f"; ended {_local(failed.ended_at)}; {DECLINED}")
    assert rows[2][0] == _local(job.claimed_at)
    assert rows[2][2].startswith("owner worker-b; ran ")
    assert rows[2][2].endswith(f"; ended {_local(job.updated_at)}")
    assert rows[-1][0] == _local(job.expires_at)


def test_a_job_waiting_for_its_retry_and_a_running_one(admin_client):
    waiting = enqueue("billing.charge", queue="billing")
    assert OwnedJobSource().fail_owned(_claim("worker-a", "billing").claim_fence, TRACEBACK,
                                       retry=True)
    job = Job.objects.get(id=waiting)
    rows = _timeline(admin_client, reverse("admin:soniq_django_job_change", args=[waiting]))
    assert [event for _, event, _ in rows] == [
        "Enqueued", "Attempt 1: failed (retried)", "Due again (retry)"]
    assert rows[1][2].endswith(DECLINED)
    assert rows[2] == (_local(job.scheduled_at), "Due again (retry)", "after attempt 1")
    page = admin_client.get(reverse("admin:soniq_django_job_change", args=[waiting]))
    timeline = page.content.decode().split('<table class="soniq-timeline">')[1]
    assert "card &lt;script&gt;alert(1)" in timeline and "<script>alert" not in timeline

    running = enqueue("reports.build", queue="reports")
    _claim("worker-c", "reports")
    job = Job.objects.get(id=running)
    page = admin_client.get(reverse("admin:soniq_django_job_change", args=[running]))
    assert job.claim_token not in page.content.decode()
    rows = _timeline(admin_client, reverse("admin:soniq_django_job_change", args=[running]))
    assert rows[-1][:2] == (_local(job.claimed_at), "Attempt 1: running")
    assert re.fullmatch(r"owner worker-c; running for [0-9.]+ s; lease until "
                        + re.escape(_local(job.lease_expires_at)), rows[-1][2])

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
    assert [row[1] for row in rows] == [
        "Enqueued", "Attempt 1: dead-lettered (permanent_failure)"]
    assert rows[0] == (_local(dead.original_created_at), "Enqueued", "queue billing")
    assert rows[1][2].endswith(f"; ended {_local(dead.moved_to_dead_letter_at)}; {DECLINED}")

    assert replay.replay_dead_letters(ids=[job_id]).replayed == (job_id,)
    dead.refresh_from_db()
    rows = _timeline(admin_client, dead_url)
    assert rows[-1] == (_local(dead.last_resurrection_at), "Replayed into the queue",
                        "the job's page has what happened since")
    job_url = reverse("admin:soniq_django_job_change", args=[job_id])
    assert f'<a href="{job_url}">The job\'s timeline since its replay.</a>' in (
        admin_client.get(dead_url).content.decode())

    # The replayed job: its earlier attempt, the replay, then its new attempt.
    _claim("worker-b", "billing")
    rows = _timeline(admin_client, job_url)
    assert [event for _, event, _ in rows] == [
        "Enqueued", "Attempt 1: dead-lettered (permanent_failure)",
        "Replayed from the dead letters", "Attempt 1: running"]
    assert rows[2][2] == "replay 1; attempts start again at 0"
    assert rows[3][2].startswith("owner worker-b; running for ")


def test_a_replay_that_ran_and_expired_says_so():
    dead = DeadLetterJob(id=None, job_name="a", queue="q", attempts=3, dead_letter_reason="x",
                         moved_to_dead_letter_at=timezone.now(), resurrection_count=2,
                         original_created_at=timezone.now())
    dead.last_resurrection_at = dead.moved_to_dead_letter_at
    events = dead_letter_events(dead, job_is_live=False)
    assert [e.what for e in events] == ["Enqueued", "1 earlier replay", "3 attempts",
                                        "Dead-lettered (x)", "Replayed into the queue"]
    assert events[2].detail == "made before attempts were recorded (migration 0020)"
    assert events[-1].detail == "no longer in soniq_jobs: it finished and its row expired"


def test_a_job_claimed_by_soniqs_own_worker_has_its_attempt_without_a_claim_time():
    job = Job(job_name="a", queue="q", status="done", attempts=1, claim_generation=0,
              created_at=timezone.now(), updated_at=timezone.now())
    events = job_events(job)
    assert [e.what for e in events] == ["Enqueued", "Attempt 1: completed"]
    assert events[1].detail.startswith("worker not recorded; claim time not recorded; ended ")


def test_a_registered_workers_attempt_links_to_its_page(admin_client):
    worker = Worker.objects.create(hostname="host-1", pid=42)
    job_id = enqueue("reports.build", queue="reports")
    _claim(str(worker.id), "reports")
    html = admin_client.get(reverse("admin:soniq_django_job_change", args=[job_id])
                            ).content.decode()
    timeline = html.split('<table class="soniq-timeline">')[1].split("</table>")[0]
    url = reverse("admin:soniq_django_worker_change", args=[worker.id])
    assert f'<a href="{url}" title="{worker.id}">worker {str(worker.id)[:8]}</a>' in timeline


def test_error_summary_is_the_last_line_cut():
    assert error_summary(TRACEBACK) == "ValueError: card <script>alert(1)</script> declined"
    assert error_summary(None) == "" and error_summary("\n \n") == ""
    assert error_summary("x" * 400) == "x" * 300 + "…"

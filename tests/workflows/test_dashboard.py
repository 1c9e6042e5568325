"""The dashboard counts jobs waiting for their dependencies apart from scheduled ones.

Both databases: a dependent, a chain's later link and a batch's callback are
queued at WAITING_SCHEDULED_AT; the dashboard's queue table and its live
figures show them as "waiting", never as "scheduled" or "due", and move them
to "due" (or "scheduled", for a later run_at) when their dependencies are done.
"""

import datetime as dt
import uuid

import pytest
from django.urls import reverse

from soniq_django import JobRequest, batch, chain, enqueue
from soniq_django.owned import OwnedJobSource
from tests.support.owned import nonce

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "flows"


def live(client) -> dict:
    figures = client.get(reverse("admin:soniq_django_dashboard_live")).json()["figures"]
    row = {queue["queue"]: queue for queue in figures["queues"]}[QUEUE]
    return {"queued": row["queued"], "count": row["counts"]["queued"],
            "totals": figures["queued_totals"]}


def page_cells(client) -> dict[str, str]:
    page = client.get(reverse("admin:soniq_django_dashboard")).content.decode()
    assert ">Waiting</th>" in page
    row = page.split(f'data-queue="{QUEUE}"')[1].split("</tr>")[0]
    return {key: row.split(f'data-status="{key}">')[1].split("</td>")[0].split(">")[-2]
            .split("<")[0] for key in ("due", "scheduled", "retrying", "waiting")}


def complete(job_id: uuid.UUID) -> None:
    source = OwnedJobSource()
    while (got := source.claim_next_owned("dash-worker", claim_token=nonce(),
                                          queues=[QUEUE])) is not None:
        if uuid.UUID(str(got.job_id)) == job_id:
            assert source.complete_owned(got.claim_fence) is True
        else:
            assert source.defer_owned(got.claim_fence, "test") is True
        if uuid.UUID(str(got.job_id)) == job_id:
            return
    raise AssertionError("the job was not claimable")


def test_jobs_waiting_for_dependencies_are_counted_apart(admin_client):
    first = enqueue("wf.step", queue=QUEUE)
    enqueue("wf.step", queue=QUEUE, depends_on=[first], run_at=dt.timedelta(hours=1))
    enqueue("wf.step", queue=QUEUE, depends_on=[first])
    chain(JobRequest("wf.step", queue=QUEUE), JobRequest("wf.step", queue=QUEUE))
    batch([JobRequest("wf.step", queue=QUEUE)], on_complete=JobRequest("wf.step", queue=QUEUE))
    enqueue("wf.step", queue=QUEUE, run_at=dt.timedelta(hours=2))  # scheduled, not waiting

    # due: first, the chain's head, the batch's member; waiting: two dependents of first,
    # the chain's second link, the batch's callback.
    assert live(admin_client) == {
        "queued": {"due": 3, "scheduled": 1, "retrying": 0, "waiting": 4}, "count": 8,
        "totals": {"due": 3, "scheduled": 1, "retrying": 0, "waiting": 4}}
    assert page_cells(admin_client) == {"due": "3", "scheduled": "1", "retrying": "0",
                                        "waiting": "4"}

    complete(first)  # its dependents are released: one due now, one at its run_at
    assert live(admin_client)["queued"] == {"due": 3, "scheduled": 2, "retrying": 0,
                                            "waiting": 2}

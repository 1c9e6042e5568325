"""The worked psql session of docs/claim-protocol.md, run as a reader would run it."""

import re
from pathlib import Path

import pytest

from soniq_django.models import Job

from tests.support.sql import run_psql

pytestmark = [pytest.mark.postgresql_only, pytest.mark.django_db(transaction=True)]

DOC = Path(__file__).resolve().parents[2] / "docs" / "claim-protocol.md"
BLOCK = re.compile(r"^```sql\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def test_the_worked_session_claims_heartbeats_and_completes_once():
    # The page has other SQL examples (registration, settling an outcome); the worked
    # session is the one block that enqueues reports.build.
    [session] = [block for block in BLOCK.findall(DOC.read_text(encoding="utf-8"))
                 if "reports.build" in block]
    result = run_psql("\\pset format unaligned\n\\pset tuples_only on\n" + session)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split()
    # heartbeat t, complete t, the repeated complete f; the batch claim 2; then
    # the completion t and the empty claim 0 of the combined query -- in order
    assert lines[-6:] == ["t", "t", "f", "2", "t", "0"], result.stdout
    first, second, third = Job.objects.filter(job_name="reports.build").order_by("created_at")
    assert (first.status, first.result, first.claim_generation, first.claim_owner) == (
        "done", {"rows": 42}, 1, "worker-7",
    )
    assert (second.status, second.result, second.claim_token) == ("done", {"rows": 7},
                                                                 "nonce-0002")
    assert (third.status, third.claim_token, third.claim_generation) == (
        "processing", "nonce-0003", 1)
    assert not Job.objects.filter(claim_token="nonce-0004").exists()

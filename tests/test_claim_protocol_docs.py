"""The worked psql session of docs/claim-protocol.md, run as a reader would run it."""

import re
from pathlib import Path

import pytest

from soniq_django.models import Job

from .test_sql_docs import run_psql

pytestmark = [pytest.mark.postgresql_only, pytest.mark.django_db(transaction=True)]

DOC = Path(__file__).resolve().parent.parent / "docs" / "claim-protocol.md"
BLOCK = re.compile(r"^```sql\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def test_the_worked_session_claims_heartbeats_and_completes_once():
    [session] = BLOCK.findall(DOC.read_text(encoding="utf-8"))
    result = run_psql("\\pset format unaligned\n\\pset tuples_only on\n" + session)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split()
    # heartbeat t, complete t, the repeated complete f -- in that order, at the end
    assert lines[-3:] == ["t", "t", "f"], result.stdout
    job = Job.objects.get(job_name="reports.build")
    assert (job.status, job.result, job.claim_generation, job.claim_owner) == (
        "done", {"rows": 42}, 1, "worker-7",
    )

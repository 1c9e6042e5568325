"""Reviewed retirement of protected submissions: dry run first, then only old terminal rows."""

import uuid
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.utils import timezone

from soniq_django.models import DeadLetterJob, Job
from soniq_django.retirement import count_retirable, cutoff_for, retire_submissions
from tests.support.schema import fetchall, open_fence_gate

pytestmark = pytest.mark.django_db

OLD = timezone.now() - timedelta(days=40)
RECENT = timezone.now() - timedelta(days=2)


def _job(name, status, changed, **owned):
    with transaction.atomic():
        open_fence_gate()
        return Job.objects.create(job_name="tests.retire", status=status, updated_at=changed,
                                  submission_id=name, submission_fingerprint=f"v1:{name}",
                                  fence_required=True, **owned)


def _dead_letter(name, moved):
    return DeadLetterJob.objects.create(
        id=uuid.uuid4(), job_name="tests.retire", dead_letter_reason="permanent_failure",
        moved_to_dead_letter_at=moved, submission_id=name, submission_fingerprint=f"v1:{name}",
        fence_required=True)


@pytest.fixture
def protected_rows():
    """Protected rows of every kind: (retired at 30 days, kept)."""
    retire = [_job("sub-old-done", "done", OLD, result={"ok": 1}),
              _job("sub-old-cancelled", "cancelled", OLD),
              _dead_letter("sub-old-dead", OLD)]
    keep = [_job("sub-new-done", "done", RECENT),
            _dead_letter("sub-new-dead", RECENT),
            _job("sub-old-queued", "queued", OLD),
            _job("sub-old-processing", "processing", OLD, claim_token="tok-live",
                 claim_owner="w1", claim_generation=1)]
    return retire, keep


def _identity(row):
    row.refresh_from_db()
    return row.submission_id, row.submission_fingerprint, row.fence_required


def _run(*args):
    out = StringIO()
    call_command("soniq_retire_submissions", *args, stdout=out)
    return out.getvalue()


def test_dry_run_counts_per_table_and_status_and_changes_nothing(protected_rows):
    retire, keep = protected_rows
    before = [_identity(row) for row in retire + keep]

    output = _run("--older-than", "30")

    assert "soniq_jobs done: 1 would be retired" in output
    assert "soniq_jobs cancelled: 1 would be retired" in output
    assert "soniq_dead_letter_jobs dead_letter: 1 would be retired" in output
    assert "soniq_jobs queued: 1 live, never retired" in output
    assert "soniq_jobs processing: 1 live, never retired" in output
    assert "dry run: nothing changed" in output
    assert [_identity(row) for row in retire + keep] == before
    for row in retire + keep:  # no ids, submission ids or tokens in the report
        assert str(row.pk) not in output and row.pk.hex not in output
    assert "sub-" not in output and "tok-" not in output


def test_confirm_clears_identity_of_old_terminal_rows_only(protected_rows):
    retire, keep = protected_rows
    kept_before = [_identity(row) for row in keep]

    output = _run("--older-than", "30", "--confirm")

    assert [_identity(row) for row in retire] == [(None, None, False)] * 3
    assert [_identity(row) for row in keep] == kept_before
    done = Job.objects.get(pk=retire[0].pk)
    assert (done.status, done.result) == ("done", {"ok": 1})  # nothing else touched
    processing = Job.objects.get(pk=keep[3].pk)
    assert (processing.claim_token, processing.claim_generation) == ("tok-live", 1)
    assert "soniq_jobs done: 1 retired" in output
    assert "soniq_dead_letter_jobs dead_letter: 1 retired" in output
    assert "sub-" not in output


def test_progress_is_plain_lines_when_not_a_terminal(protected_rows):
    for number in range(5):
        _job(f"sub-extra-{number}", "done", OLD)
    output = _run("--older-than", "30", "--confirm")
    assert "\r" not in output
    assert "soniq_jobs done: 6/6" in output.splitlines()


def test_batches_report_progress_and_retire_everything(protected_rows):
    for number in range(4):
        _job(f"sub-extra-{number}", "done", OLD)
    seen = []
    result = retire_submissions(cutoff_for(timedelta(days=30)), batch_size=2,
                                progress=lambda *args: seen.append(args))
    assert ("soniq_jobs", "done", 2, 5) in seen and ("soniq_jobs", "done", 5, 5) in seen
    assert {(g.table, g.status, g.rows) for g in result} == {
        ("soniq_jobs", "done", 5), ("soniq_jobs", "cancelled", 1),
        ("soniq_dead_letter_jobs", "dead_letter", 1)}
    assert all(g.rows == 0 for g in count_retirable(cutoff_for(timedelta(days=30)))
               if g.eligible)


def test_a_negative_age_is_refused():
    with pytest.raises(CommandError, match="older-than"):
        _run("--older-than", "-1")


@pytest.mark.postgresql_only
def test_the_update_runs_with_the_fenced_write_flag_on_and_switches_it_off(protected_rows):
    # A stand-in for the protection trigger: any write to these rows without the flag fails.
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION pg_temp.require_flag() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN IF current_setting('soniq.fenced_write', true) IS DISTINCT FROM 'on' THEN "
            "RAISE EXCEPTION 'write without the flag'; END IF; RETURN NEW; END $$")
        for table in ("soniq_jobs", "soniq_dead_letter_jobs"):
            cursor.execute(f"CREATE TRIGGER require_flag BEFORE UPDATE ON {table} "
                           "FOR EACH ROW EXECUTE FUNCTION pg_temp.require_flag()")

    retired = retire_submissions(cutoff_for(timedelta(days=30)))

    assert sum(group.rows for group in retired) == 3
    assert fetchall("SELECT current_setting('soniq.fenced_write', true)") == [("off",)]
    with pytest.raises(Exception, match="without the flag"), transaction.atomic():
        Job.objects.filter(pk=protected_rows[1][0].pk).update(submission_fingerprint=None)

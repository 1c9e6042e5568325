"""Enqueueing through PgBouncer in transaction mode, with the default settings.

Before soniq_django knew about poolers, ``enqueue()`` prepared its
statement on every connection: through a transaction pool the statement
was parsed on one server connection and bound on another ("prepared
statement does not exist"), or met a leftover of another client's
("already exists"), and a few hundred of 400 single enqueues and none of
2,000 bulk ones were written. Now the producer sees the pooler (its cancel
key names another process than the server session's) and does not
prepare; with ``PREPARED_STATEMENTS=True`` a failed prepared call is sent
again unprepared, and nothing is deallocated that another client owns.
"""

import json

import pytest

from soniq_django.models import Job

# Processes behind PgBouncer: run in the Django 5.2 passes only.
pytestmark = [pytest.mark.postgresql_only, pytest.mark.django_db(transaction=True),
              pytest.mark.version_independent]


def _produce(processes, tmp_path, count: int, *, single: int, bulk: int, size: int, **soniq):
    """Run ``count`` producer processes at once; their reports."""
    env = {"SONIQ_TEST_SINGLE": str(single), "SONIQ_TEST_BULK": str(bulk),
           "SONIQ_TEST_BULK_SIZE": str(size)}
    outs = [tmp_path / f"produced-{n}.json" for n in range(count)]
    children = [processes.start("-m", "tests.deploy.client", "produce", str(out), env=env,
                                **soniq) for out in outs]
    for child in children:
        assert child.wait(90) == 0, child.log()[-3000:]
    return [json.loads(out.read_text()) for out in outs]


def _all_written_exactly(reports, expected: int) -> None:
    failures = [report["failures"] for report in reports if report["failures"]]
    assert failures == []
    ids = [job_id for report in reports for job_id in report["ids"]]
    assert len(ids) == len(set(ids)) == expected
    assert Job.objects.count() == expected
    assert set(map(str, Job.objects.values_list("id", flat=True))) == set(ids)


def test_single_and_bulk_enqueues_from_several_processes_are_all_written(processes, tmp_path):
    # 4 processes x (100 single + 5 bulk of 100), at once, through 6 server connections.
    reports = _produce(processes, tmp_path, 4, single=100, bulk=5, size=100)
    _all_written_exactly(reports, 4 * (100 + 500))


def test_bulk_enqueues_loaded_by_copy_from_several_processes_are_all_written(
        processes, tmp_path):
    # Batches above the COPY threshold (producer/_copy.py): a COPY runs inside
    # the batch's transaction, so the pool may hand every batch another server.
    from soniq_django.producer._copy import COPY_MIN_JOBS

    size = COPY_MIN_JOBS + 100
    reports = _produce(processes, tmp_path, 3, single=1, bulk=3, size=size)
    _all_written_exactly(reports, 3 * (1 + 3 * size))


def test_prepared_statements_forced_on_fall_back_unprepared(processes, tmp_path):
    # PgBouncer 1.18 keeps no prepared statements in transaction mode: every
    # failed prepared call is sent again unprepared, and the process warns.
    reports = _produce(processes, tmp_path, 3, single=60, bulk=4, size=50,
                       PREPARED_STATEMENTS=True)
    _all_written_exactly(reports, 3 * (60 + 200))
    logs = "".join(child.log() for child in processes.children)
    assert "SONIQ['PREPARED_STATEMENTS']" in logs and "Traceback" not in logs


def test_a_failed_prepared_call_deallocates_nothing_another_client_owns(
        processes, tmp_path, bouncer):
    out = tmp_path / "bystander.json"
    child = processes.start(
        "-m", "tests.deploy.client", "bystander", str(out),
        env={"SONIQ_WORKER_DATABASE_URL": bouncer.url("soniq_one"),
             "SONIQ_TEST_ADMIN_URL": bouncer.url("pgbouncer"),
             "SONIQ_TEST_BYSTANDER_URL": bouncer.url("soniq_one")},
        PREPARED_STATEMENTS=True)
    assert child.wait(60) == 0, child.log()[-3000:]
    report = json.loads(out.read_text())
    written = set(map(str, Job.objects.values_list("id", flat=True)))
    # Every enqueue was written, the one after the server connection changed too ...
    assert {report[k] for k in ("first", "first_bulk", "after_swap", "after_swap_bulk")} <= written
    assert Job.objects.count() == 4  # ... and the rolled-back one was not
    # ... and the rollback sent no DEALLOCATE ALL to the server connection it shares.
    assert report["bystander"] == 42

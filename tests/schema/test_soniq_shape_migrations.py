"""Migrations 0006-0008, which give the shared tables Soniq 0.1.0's shape, on both backends.

0006 is tried on a database of its own (a PostgreSQL database made and
dropped here, or an SQLite file) that holds rows in soniq_django's older
design of soniq_workers and soniq_task_registry. The protection trigger of
0007 is tried on the test database. tests/test_soniq_interop.py runs Soniq
itself against all of this.
"""

import json
import os
import secrets
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from django.conf import settings
from django.db import DatabaseError, connection, transaction

from soniq_django import enqueue
from soniq_django.producer.request import JobRequest
from soniq_django.models import Job
from soniq_django.owned import OwnedJobSource
from tests.support.owned import nonce

ROOT = Path(__file__).resolve().parents[2]


def _server_url(name: str) -> str:
    db = settings.DATABASES["default"]
    credentials = quote(db["USER"] or "", safe="")
    if db["PASSWORD"]:
        credentials += ":" + quote(db["PASSWORD"], safe="")
    port = f":{db['PORT']}" if db["PORT"] else ""
    host = quote(db["HOST"] or "", safe="")
    return f"postgres://{credentials}@{host}{port}/{quote(name, safe='')}"


class Private:
    """A database of this test's own, on the backend of the pass."""

    def __init__(self, tmp_path: Path):
        self.postgresql = settings.BACKEND == "postgresql"
        if self.postgresql:
            base = settings.DATABASES["default"].get("TEST", {}).get("NAME") or "test_soniq"
            self.name = f"{base}_m{os.getpid()}_{secrets.token_hex(3)}"
            self._admin(f'CREATE DATABASE "{self.name}"')
            self.url = _server_url(self.name)
        else:
            self.url = f"sqlite:///{tmp_path / 'private.sqlite3'}"

    def _admin(self, statement: str) -> None:
        with psycopg.connect(_server_url(settings.DATABASES["default"]["NAME"]),
                             autocommit=True) as admin:
            admin.execute(statement)

    def close(self) -> None:
        if self.postgresql:
            self._admin(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def manage(self, *args: str) -> str:
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.worker_settings",
               "SONIQ_WORKER_DATABASE_URL": self.url}
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, f"{args}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        return done.stdout

    def migrate(self, target: str) -> None:
        self.manage("migrate", "soniq_django", target, "--noinput")

    def sql(self, query: str, params=()) -> list[tuple]:
        if self.postgresql:
            with psycopg.connect(self.url, autocommit=True) as conn:
                cursor = conn.execute(query.replace("?", "%s"), params)
                return cursor.fetchall() if cursor.description else []
        with sqlite3.connect(self.url.removeprefix("sqlite:///")) as conn:
            return conn.execute(query, params).fetchall()

    def uuid(self, value: uuid.UUID) -> str:
        return str(value) if self.postgresql else value.hex

    def queues(self, value):
        """A queues value as read back: a list on PostgreSQL, JSON text on SQLite."""
        return value if self.postgresql or value is None else json.loads(value)


@pytest.fixture
def private(tmp_path):
    db = Private(tmp_path)
    try:
        yield db
    finally:
        db.close()


def test_0006_gives_the_worker_tables_soniqs_shape_keeping_the_rows_and_back(private):
    private.migrate("0005")
    older, newer, other = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    rows = [  # id, hostname, pid, queues (JSON), status, heartbeat
        (older, "h", 1, '["a", "b"]', "running", "2024-01-01 00:00:00"),
        (newer, "h", 1, None, "stopped", "2024-01-02 00:00:00"),
        (other, "h", 2, '["x"]', "running", "2024-01-02 00:00:00"),
    ]
    for worker_id, host, pid, queues, status, beat in rows:
        private.sql("INSERT INTO soniq_workers (id, hostname, pid, queues, concurrency, status, "
                    "started_at, last_heartbeat_at) VALUES (?, ?, ?, ?, 1, ?, ?, ?)",
                    (private.uuid(worker_id), host, pid, queues, status, beat, beat))
    job = uuid.uuid4()
    private.sql("INSERT INTO soniq_jobs (id, job_name, worker_id, fence_required) "
                "VALUES (?, 'a.b', ?, ?)", (private.uuid(job), private.uuid(older), True))
    private.sql("INSERT INTO soniq_task_registry (job_name) VALUES ('a.b')")

    private.migrate("0008")

    found = {private.uuid(uuid.UUID(str(row[0]))): row[1:] for row in private.sql(
        "SELECT id, hostname, pid, queues, status, last_heartbeat, version FROM soniq_workers")}
    # One row per process: the latest of (h, 1) stays; ids are kept.
    assert set(found) == {private.uuid(newer), private.uuid(other)}
    # NULL ("every queue") is Soniq's empty array on PostgreSQL; SQLite keeps NULL.
    every = [] if private.postgresql else None
    assert [private.queues(found[private.uuid(w)][2]) for w in (newer, other)] == [every, ["x"]]
    assert [found[private.uuid(w)][3] for w in (newer, other)] == ["stopped", "active"]
    # The replaced row's job keeps everything but the link (a protected row, too).
    assert private.sql("SELECT worker_id, fence_required FROM soniq_jobs") == [(None, True)]
    # The registry is Soniq's, empty: workers rewrite it when they start.
    assert private.sql("SELECT count(*) FROM soniq_task_registry") == [(0,)]
    index_names = {"idx_soniq_workers_last_heartbeat", "idx_soniq_workers_status",
                   "idx_soniq_task_registry_task_name"}
    if private.postgresql:
        listed = private.sql("SELECT indexname FROM pg_indexes WHERE indexname LIKE 'idx_soniq%%'")
    else:
        listed = private.sql("SELECT name FROM sqlite_master WHERE name LIKE 'idx_soniq%'")
    assert index_names <= {name for (name,) in listed}

    # A worker (which needs every migration, 0009's protocol included)
    # registers in the new shape, next to the kept rows.
    private.manage("migrate", "soniq_django", "--noinput")
    private.manage("soniq_worker", "--burst", "--queues", "nothing-here")
    (version,) = private.sql("SELECT version FROM soniq_workers WHERE pid NOT IN (1, 2)")[0]
    assert version.startswith("soniq_django ")
    assert private.sql("SELECT count(DISTINCT worker_id) FROM soniq_task_registry") == [(1,)]

    private.migrate("0005")
    back = {private.uuid(uuid.UUID(str(row[0]))): row[1:] for row in private.sql(
        "SELECT id, status, queues, stopped_at IS NOT NULL FROM soniq_workers WHERE pid IN (1, 2)")}
    assert back[private.uuid(newer)][0] == "stopped" and back[private.uuid(newer)][2]
    assert back[private.uuid(other)][0] == "running"
    other_queues = back[private.uuid(other)][1]
    assert (other_queues if private.postgresql else json.loads(other_queues)) == ["x"]
    private.sql("INSERT INTO soniq_task_registry (job_name) VALUES ('x.y')")  # the 0001 shape
    private.migrate("0008")


# -- the protection trigger, version 2 (0007) ------------------------------------

def _id_only(sql: str, job_id) -> int:
    """Run an id-only write, as a worker that knows nothing of fences would; rows changed."""
    with connection.cursor() as cursor:
        cursor.execute(sql, [job_id])
        return cursor.rowcount


@pytest.mark.postgresql_only
@pytest.mark.django_db
def test_an_id_only_claim_of_an_owned_submission_fails_instead_of_being_skipped():
    owned = OwnedJobSource().submit_owned(JobRequest("a.owned", {}), submission_id="s-1")
    with pytest.raises(DatabaseError) as refused, transaction.atomic():
        _id_only("UPDATE soniq_jobs SET status = 'processing', attempts = attempts + 1 "
                 "WHERE id = %s", owned)
    assert refused.value.__cause__.sqlstate == "55000"
    assert "only a fenced claim" in str(refused.value)
    # Other id-only writes to it are still skipped without a word.
    assert _id_only("UPDATE soniq_jobs SET status = 'cancelled' WHERE id = %s", owned) == 0
    assert _id_only("DELETE FROM soniq_jobs WHERE id = %s", owned) == 0
    assert Job.objects.get(id=owned).status == "queued"


@pytest.mark.postgresql_only
@pytest.mark.django_db
def test_a_job_retried_after_an_owned_claim_can_be_claimed_and_finished_by_id():
    source = OwnedJobSource()
    job_id = enqueue("a.plain")
    claimed = source.claim_next_owned("worker-a", claim_token=nonce())
    assert source.fail_owned(claimed.claim_fence, "boom", retry=True, retry_delay=0)
    row = Job.objects.get(id=job_id)
    assert (row.status, row.lease_expires_at, row.claim_token is not None) == (
        "queued", None, True)
    # A worker that claims by id alone (Soniq 0.1.0) takes it and finishes it.
    assert _id_only("UPDATE soniq_jobs SET status = 'processing', attempts = attempts + 1 "
                    "WHERE id = %s", job_id) == 1
    assert _id_only("UPDATE soniq_jobs SET status = 'done' WHERE id = %s", job_id) == 1
    assert Job.objects.get(id=job_id).status == "done"
    # A live owned claim (a token and a lease) stays protected.
    live_id = enqueue("a.plain")
    live = source.claim_next_owned("worker-a", claim_token=nonce())
    assert live.job_id == live_id
    assert _id_only("UPDATE soniq_jobs SET status = 'done' WHERE id = %s", live_id) == 0
    assert source.complete_owned(live.claim_fence) is True

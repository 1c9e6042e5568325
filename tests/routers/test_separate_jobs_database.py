"""A project whose jobs live in a database of their own, behind a router, end to end.

The project is tests/routers/settings.py: ``default`` for the application,
``jobs`` for soniq_django's tables, ``jobs_replica`` (read-only) for reads,
and the router of tests/routers/router.py. Each test runs real processes
of it: ``manage.py migrate``/``check``/``soniq_worker``, and the scenarios
of tests/routers/scenarios.py (the example shop's view, the admin, the
commands). Both databases are made here for this module and dropped after:
two SQLite files in the SQLite pass, two PostgreSQL databases of their own
in the PostgreSQL pass. Rows are checked with plain SQL on the databases.
"""

import json
import os
import secrets
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.ci import unavailable

ROOT = Path(__file__).resolve().parents[2]
SERVER_URL = os.environ.get("SONIQ_TEST_DATABASE_URL",
                            "postgres://postgres@127.0.0.1:5432/postgres")


class Project:
    """The two databases of one separate-jobs-database project, and ways to run it."""

    def __init__(self, backend: str, tmp: Path):
        self.backend = backend
        self.tmp = tmp
        self.names: dict[str, str] = {}
        self.migrations: dict[str, subprocess.CompletedProcess] = {}

    # -- databases ---------------------------------------------------------

    def create(self) -> None:
        if self.backend == "sqlite":
            self.names = {alias: str(self.tmp / f"{alias}.sqlite3")
                          for alias in ("default", "jobs")}
            return
        suffix = f"{os.getpid()}_{secrets.token_hex(3)}"
        self.names = {"default": f"soniq_rt_app_{suffix}", "jobs": f"soniq_rt_jobs_{suffix}"}
        with self._server() as server:
            for name in self.names.values():
                server.execute(f'CREATE DATABASE "{name}"')

    def drop(self) -> None:
        if self.backend == "postgresql" and self.names:
            with self._server() as server:
                for name in self.names.values():
                    server.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def _server(self):
        import psycopg

        try:
            return psycopg.connect(_libpq(SERVER_URL), autocommit=True)
        except psycopg.OperationalError:
            unavailable("no PostgreSQL server to make the project's databases on")

    def url(self, alias: str) -> str:
        if self.backend == "sqlite":
            return f"sqlite:///{self.names[alias]}"
        return SERVER_URL.rsplit("/", 1)[0] + "/" + self.names[alias]

    def rows(self, alias: str, sql: str, *params) -> list[tuple]:
        """Run one query on a database (``%s`` placeholders) and return its rows."""
        if self.backend == "sqlite":
            with sqlite3.connect(self.names[alias]) as db:
                return db.execute(sql.replace("%s", "?"), params).fetchall()
        import psycopg

        with psycopg.connect(_libpq(self.url(alias))) as db:
            return db.execute(sql, params).fetchall()

    def stored_id(self, job_id: str) -> str:
        """A job id as a query parameter: Django keeps UUIDs as 32 hex digits on SQLite."""
        return job_id.replace("-", "") if self.backend == "sqlite" else job_id

    def tables(self, alias: str) -> set[str]:
        if self.backend == "sqlite":
            found = self.rows(alias, "SELECT name FROM sqlite_master WHERE type = 'table'")
        else:
            found = self.rows(alias, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        return {name for (name,) in found}

    # -- processes ---------------------------------------------------------

    def env(self) -> dict:
        env = dict(os.environ)
        env.update({
            "DJANGO_SETTINGS_MODULE": "tests.routers.settings",
            "SONIQ_ROUTERS_DEFAULT_URL": self.url("default"),
            "SONIQ_ROUTERS_JOBS_URL": self.url("jobs"),
            "SONIQ_ROUTERS_ANALYTICS_PATH": str(self.tmp / "analytics.sqlite3"),
            "PYTHONUNBUFFERED": "1",
        })
        return env

    def manage(self, *args: str, env: dict | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess:
        """``manage.py *args`` of the project; its output (stdout and stderr) in ``.stdout``."""
        return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT,
                              env={**self.env(), **(env or {})},
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout)

    def scenario(self, name: str, *args: str) -> dict:
        """Run one scenario of tests/routers/scenarios.py and return what it observed."""
        done = subprocess.run([sys.executable, "-m", "tests.routers.scenarios", name, *args],
                              cwd=ROOT, env=self.env(), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=120)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        assert lines, f"scenario {name} printed no result:\n{done.stdout}\n{done.stderr[-3000:]}"
        return json.loads(lines[-1][len("RESULT "):])


def _libpq(url: str) -> str:
    return "postgresql://" + url.split("://", 1)[1]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """The project, migrated as its docs say: ``migrate`` on default, then on jobs."""
    from django.conf import settings

    made = Project(settings.BACKEND, tmp_path_factory.mktemp("routers"))
    made.create()
    try:
        for alias in ("default", "jobs"):
            made.migrations[alias] = made.manage("migrate", "--database", alias)
        yield made
    finally:
        made.drop()


@pytest.fixture(scope="module")
def producer_role(project):
    """A PostgreSQL role for soniq_grant (PostgreSQL pass), dropped afterwards; "" on SQLite."""
    if project.backend != "postgresql":
        yield ""
        return
    role = f"soniq_rt_producer_{secrets.token_hex(3)}"
    with project._server() as server:
        server.execute(f'CREATE ROLE "{role}"')
    try:
        yield role
    finally:
        project.drop()  # the grants live in the databases; drop them before the role
        with project._server() as server:
            server.execute(f'DROP ROLE IF EXISTS "{role}"')


def test_migrate_puts_soniq_tables_in_jobs_only_and_checks_follow_the_router(project):
    for alias, run in project.migrations.items():
        assert run.returncode == 0, run.stdout[-3000:]
    # No advice to migrate soniq on default, where the router keeps it out.
    assert "--database default" not in project.migrations["default"].stdout
    assert "soniq.W004" not in project.migrations["default"].stdout
    assert "soniq_jobs" in project.tables("jobs")
    assert not {t for t in project.tables("default") if t.startswith("soniq_")}
    assert "shop_order" in project.tables("default")
    # Once everything is applied, migrate and check on default ask nothing of
    # soniq there (before: "function soniq_task_name_pattern_v1() does not exist").
    again = project.manage("migrate", "--database", "default")
    assert again.returncode == 0, again.stdout[-3000:]
    check = project.manage("check", "--database", "default", "--database", "jobs",
                           "--database", "jobs_replica", "--fail-level", "WARNING")
    assert check.returncode == 0, check.stdout[-3000:]
    assert "no issues" in check.stdout


def test_checks_look_only_at_the_databases_soniq_uses(project):
    # analytics is SQLite without IMMEDIATE mode and jobs_replica never
    # writes: neither is soniq's to warn about (soniq.W002).
    check = project.manage("check", "--fail-level", "WARNING")
    assert check.returncode == 0, check.stdout[-3000:]
    if project.backend == "postgresql":
        # Every database soniq uses is PostgreSQL; analytics (SQLite) is not one.
        check = project.manage("check", "--fail-level", "WARNING",
                               env={"SONIQ_ROUTERS_REQUIRE_SQL_API": "1"})
        assert check.returncode == 0, check.stdout[-3000:]


def test_enqueue_on_commit_waits_for_every_open_transaction(project):
    seen = project.scenario("on_commit")
    assert seen == {
        "default: inside the block": False,
        "default: after its commit": True,
        "default rolled back": False,
        "savepoint on default rolled back, default committed": False,
        "both open: after jobs committed": False,
        "both open: after default committed too": True,
        "both open: jobs committed, default rolled back": False,
        "jobs only: inside the block": False,
        "jobs only: after its commit": True,
        "no transaction: at once": True,
        "test case: captured on default only": False,
        "test case: captured on both": True,
        "tasks: inside the block on default": False,
        "tasks: after the commit of default": True,
        "tasks: default rolled back": False,
    }


def test_enqueue_now_warns_only_outside_the_jobs_transaction(project):
    report = project.scenario("enqueue_warnings")
    warned = {"category": "RuntimeWarning", "file": "scenarios.py", "names_default": True,
              "names_jobs": True}
    for key, caught in report.items():
        place = key.split(":")[0]
        expected = [warned] if place == "default open" else []
        assert caught == expected, key


def test_get_job_and_task_results_read_the_replica(project):
    assert project.scenario("reads") == {"status": "queued", "task status": "READY",
                                         "queries on jobs_replica": True, "queries on jobs": 0}


def test_the_worker_without_database_runs_the_jobs_of_the_routers_alias(project):
    queued = project.manage("soniq_enqueue", "tests.add", "--args", '{"a": 2, "b": 3}',
                            "--queue", "worker-alias", "--database", "jobs")
    assert queued.returncode == 0, queued.stdout[-3000:]
    job_id = queued.stdout.strip().splitlines()[-1]
    run = project.manage("soniq_worker", "--burst", "--queues", "worker-alias")
    assert run.returncode == 0, run.stdout[-3000:]
    assert project.rows("jobs", "SELECT status, result FROM soniq_jobs WHERE id = %s",
                        project.stored_id(job_id)) in ([("done", 5)], [("done", "5")])
    [(registered,)] = project.rows("jobs", "SELECT count(*) FROM soniq_workers")
    assert registered >= 1


def test_a_rolled_back_order_leaves_no_job_and_a_committed_one_runs_on_the_worker(project):
    failed = project.scenario("place_order", "1")
    assert failed == {"status": 409, "job_id": None, "order_id": None, "new orders": 0,
                      "new receipt jobs": 0}
    placed = project.scenario("place_order", "0")
    assert (placed["status"], placed["new orders"], placed["new receipt jobs"]) == (201, 1, 1)
    # The worker without --database finds the job through the router.
    run = project.manage("soniq_worker", "--burst")
    assert run.returncode == 0, run.stdout[-3000:]
    [(status, result)] = project.rows(
        "jobs", "SELECT status, result FROM soniq_jobs WHERE id = %s",
        project.stored_id(placed["job_id"]))
    result = json.loads(result) if isinstance(result, str) else result
    assert (status, result) == ("done", {"to": "buyer@example.com", "amount_cents": 1250})
    [(receipt,)] = project.rows("default", "SELECT receipt_job_id FROM shop_order WHERE id = %s",
                                placed["order_id"])
    assert str(receipt).replace("-", "") == placed["job_id"].replace("-", "")


def test_an_atomic_job_writing_to_the_application_database_says_that_is_outside_it(project):
    # The order view queues shop.confirm_order, an atomic job: it runs in a
    # transaction on jobs, and its Confirmation row goes to default -- outside
    # that transaction, which the worker says once per job name and alias.
    placed = project.scenario("place_order", "0")
    assert placed["status"] == 201
    run = project.manage("soniq_worker", "--burst")
    assert run.returncode == 0, run.stdout[-3000:]
    warnings = [line for line in run.stdout.splitlines() if "outside its transaction" in line]
    assert len(warnings) == 1, run.stdout[-3000:]
    assert ("shop.confirm_order: an atomic job wrote to the database 'default'" in warnings[0]
            and "only its writes to 'jobs' commit with its completion" in warnings[0])
    [(confirmations,)] = project.rows(
        "default", "SELECT count(*) FROM shop_confirmation WHERE order_id = %s",
        placed["order_id"])
    assert confirmations == 1  # written (outside the guarantee), once: the job ran once


def test_admin_lists_from_the_replica_and_acts_on_the_jobs_database(project):
    report = project.scenario("admin")
    after = report.pop("after")
    log, ids = report.pop("log"), report.pop("ids")
    assert report == {
        "list job": 200, "list deadletterjob": 200, "list recurringjob": 200,
        "list worker": 200, "list taskregistration": 200, "dashboard": 200,
        "cancel_selected": 302, "retry_selected_now": 302, "delete_selected_finished": 302,
        "replay_selected": 302, "pause_selected": 302,
    }
    assert after == {"queued job": "cancelled", "later job is due": True,
                     "done job deleted": True, "dead letter replayed": True,
                     "schedule": "paused"}
    # Every action is in the admin log, on default, with who did it.
    assert log == sorted([
        [True, "job", ids["queued"], 2, "Cancelled from the admin."],
        [True, "job", ids["later"], 2, "Made due now from the admin."],
        [True, "job", ids["done"], 3, "Deleted from the admin (a finished job)."],
        [True, "job", ids["dead"], 2, "Replayed from the admin."],
        [True, "recurringjob", ids["schedule"], 2, "Paused the schedule from the admin."],
    ])
    assert "django_admin_log" not in project.tables("jobs")


def test_commands_without_database_use_the_routers_alias(project, producer_role):
    report = project.scenario("commands", producer_role)
    expected = {name: "ok" for name in (
        "soniq_status", "soniq_enqueue", "soniq_scheduler", "soniq_purge", "soniq_replay",
        "soniq_check_schema", "soniq_retire_submissions")}
    if producer_role:
        expected["soniq_grant"] = "ok"
    assert report == expected

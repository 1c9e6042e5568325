"""Each test run has a PostgreSQL test database of its own, and leaves none behind.

Two runs of ``make test`` against one server used to share the fixed name
``test_soniq_django``: the second run's set-up dropped (or failed to drop)
the first one's database. tests/settings.py now picks a name per run and
exports it to the processes the run starts; scripts/run-tests drops what a
killed run left (tests/support/run_databases.py).
"""

import os
import secrets
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from tests.settings import TEST_DATABASE_PREFIX, run_database_name
from tests.support.run_databases import drop_run_databases, run_databases

ROOT = Path(__file__).resolve().parents[1]
PRINT_NAME = ("import tests.settings as s; print(s.DATABASES['default']['TEST']['NAME'])")
# A run (this child) that starts a process of its own, which reads the settings too.
PRINT_BOTH = (
    PRINT_NAME + "; import subprocess, sys; "
    "print(subprocess.run([sys.executable, '-c', " + repr(PRINT_NAME) + "], "
    "capture_output=True, text=True, check=True).stdout.strip())"
)


def in_a_fresh_run(code: str, **env) -> list[str]:
    """Run ``code`` in a new process as a new test run would start (no name chosen yet)."""
    environment = {key: value for key, value in os.environ.items()
                   if key != "SONIQ_TEST_DATABASE_NAME"}
    environment.update(SONIQ_TEST_BACKEND="postgresql", PYTHONPATH=str(ROOT), **env)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_two_runs_at_once_choose_different_database_names():
    first, second = in_a_fresh_run(PRINT_NAME), in_a_fresh_run(PRINT_NAME)
    assert first != second
    for name in (first[0], second[0]):
        assert name.startswith(TEST_DATABASE_PREFIX) and len(name) <= 63  # a PostgreSQL name


def test_every_process_of_one_run_uses_the_runs_name():
    parent, child = in_a_fresh_run(PRINT_BOTH)
    assert parent == child


def test_a_name_given_in_the_environment_is_used_as_it_is():
    assert in_a_fresh_run(PRINT_BOTH, SONIQ_TEST_DATABASE_NAME="test_soniq_mine") == [
        "test_soniq_mine", "test_soniq_mine"]


@pytest.mark.postgresql_only
@pytest.mark.django_db
def test_this_run_is_on_the_database_it_exported():
    assert connection.settings_dict["NAME"] == os.environ["SONIQ_TEST_DATABASE_NAME"] == (
        run_database_name())


@pytest.mark.postgresql_only
def test_a_killed_runs_databases_are_dropped_and_no_one_elses():
    from tests.support.worker_processes import database_url

    server = database_url(connection).rsplit("/", 1)[0] + "/postgres"
    run = f"{TEST_DATABASE_PREFIX}{os.getpid()}_{secrets.token_hex(3)}"
    mine = [run, f"{run}_plugin", f"{run}_m1_abc"]
    others = [f"{run}9", f"{run}plugin"]  # another run's names may share the digits
    with psycopg.connect(server, autocommit=True) as admin:
        for name in mine + others:
            admin.execute(f'CREATE DATABASE "{name}"')
        try:
            # A connection a killed worker process left open does not stop the drop.
            left_open = psycopg.connect(server.rsplit("/", 1)[0] + f"/{run}", autocommit=True)
            try:
                assert sorted(run_databases(admin, run)) == sorted(mine)
                assert sorted(drop_run_databases(server, run)) == sorted(mine)
            finally:
                left_open.close()
            remaining = {row[0] for row in admin.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE %s", [run + "%"])}
            assert remaining == set(others)
        finally:
            for name in mine + others:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_the_drop_command_fails_quietly_without_a_server():
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.run_databases", "drop",
         "postgres://nobody@127.0.0.1:1/postgres", f"{TEST_DATABASE_PREFIX}1_abcdef"],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (1, "", "")

"""Before ``migrate``: a database without soniq_django's tables and functions.

Every call says which migrate to run -- ``enqueue()`` and its siblings with
``MigrationsNotApplied`` (QUEUE_DATABASE_REFUSED), each management command
with the same text as a ``CommandError`` -- instead of "function
soniq_enqueue(...) does not exist", "no such table" or a traceback. The
database here is a new, empty one beside the test database
(tests/support/fresh.py), as a project has before its first migrate.
"""

import io
import re
import uuid

import pytest
from django.core.management import CommandError, call_command
from django.db import connections

from soniq_django import bulk_enqueue, enqueue, get_job
from soniq_django.errors import ErrorCode, MigrationsNotApplied
from soniq_django.owned import JobRequest, OwnedJobSource
from tests.support.fresh import fresh_database
from tests.testapp.jobs import add

ALIAS = "before_migrate"


@pytest.fixture(scope="module")
def empty_database(django_db_blocker, tmp_path_factory):
    with django_db_blocker.unblock(), fresh_database(ALIAS, tmp_path_factory.mktemp("fresh")):
        yield ALIAS


@pytest.fixture
def empty(empty_database, django_db_blocker):
    """The alias of the empty database, usable in the test."""
    with django_db_blocker.unblock():
        yield empty_database


def refusal(alias: str) -> str:
    """The text of MigrationsNotApplied on ``alias``, its SQLSTATE left open."""
    return (r"QUEUE_DATABASE_REFUSED: soniq_django migrations are not applied on database "
            rf"'{alias}' \((SQLSTATE 42P01|SQLSTATE 42883|SQLITE_ERROR): a soniq table or "
            rf"function is missing\)\. Run: python manage.py migrate soniq_django "
            rf"--database {alias}")


CALLS = {
    "enqueue": lambda alias: enqueue("tests.add", {"a": 1}, using=alias),
    "bulk_enqueue": lambda alias: bulk_enqueue([JobRequest("tests.add", {"a": 1})], using=alias),
    "get_job": lambda alias: get_job(uuid.uuid4(), using=alias),
    "handler.enqueue": lambda alias: add.configure(using=alias).enqueue(a=1),
    "submit_owned": lambda alias: OwnedJobSource(using=alias).submit_owned(
        JobRequest("tests.add", {"a": 1}), submission_id="before-migrate"),
}


@pytest.mark.parametrize("call", list(CALLS))
def test_a_producer_call_says_which_migrate_to_run(empty, call):
    with pytest.raises(MigrationsNotApplied) as raised:
        CALLS[call](empty)
    error = raised.value
    assert error.code is ErrorCode.QUEUE_DATABASE_REFUSED
    assert error.alias == empty
    assert re.fullmatch(refusal(empty), str(error)), str(error)
    expected = "SQLITE_ERROR" if connections[empty].vendor == "sqlite" else (
        "SQLSTATE 42P01" if call == "submit_owned" else "SQLSTATE 42883")
    assert error.what == expected


COMMANDS = [
    ("soniq_status",), ("soniq_status", "--json"), ("soniq_purge",), ("soniq_replay", "--all"),
    ("soniq_replay", "0123abcd"), ("soniq_cancel", "--queue", "default"),
    ("soniq_cancel", "0123abcd", "--dry-run"),
    ("soniq_enqueue", "tests.add"), ("soniq_retire_submissions", "--older-than", "30"),
    ("soniq_retire_submissions", "--older-than", "30", "--confirm"),
    pytest.param(("soniq_grant", "postgres"), marks=pytest.mark.postgresql_only),
]


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_a_command_says_which_migrate_to_run_without_a_traceback(empty, argv):
    # A CommandError is what manage.py prints as one line, without a traceback.
    with pytest.raises(CommandError) as raised:
        call_command(*argv, "--database", empty, stdout=io.StringIO())
    assert re.fullmatch(refusal(empty), str(raised.value)), str(raised.value)


@pytest.mark.parametrize("argv", [("soniq_worker", "--burst"), ("soniq_scheduler", "--once")],
                         ids=" ".join)
def test_the_long_running_commands_refuse_to_start_and_list_what_is_pending(empty, argv):
    with pytest.raises(CommandError) as raised:
        call_command(*argv, "--database", empty)
    assert str(raised.value).startswith(
        f"soniq_django migrations are not all applied on database '{empty}' (pending: "
        "0001_format1, 0002_producer_api, ")
    assert str(raised.value).endswith(f"Run: python manage.py migrate soniq_django "
                                      f"--database {empty}")

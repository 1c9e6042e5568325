"""Router rules that need no second database: checks, the admin's write alias, warnings.

The project with a separate jobs database runs in
test_separate_jobs_database.py; these run in the suite's own process, on
its one test database, with routers swapped in by ``override_settings``.
"""

import warnings

import pytest
from django.core.management import CommandError
from django.db import transaction
from django.test import override_settings

from soniq_django import bulk_enqueue, enqueue
from soniq_django.admin.base import write_alias
from soniq_django.checks import check_database, check_settings, soniq_aliases
from soniq_django.management.database import database_alias
from soniq_django.models import Job
from soniq_django.owned import JobRequest
from tests.testapp import tasks
from tests.testapp.jobs import add


class KeepSoniqOut:
    """A router whose allow_migrate() refuses soniq_django everywhere; it routes nothing."""

    def allow_migrate(self, db, app_label, **hints):
        return False if app_label == "soniq_django" else None


class ReadElsewhere:
    """A router that reads soniq's rows from an alias ``replica`` and writes to default."""

    def db_for_read(self, model, **hints):
        return "replica" if model._meta.app_label == "soniq_django" else None

    def db_for_write(self, model, **hints):
        return "default" if model._meta.app_label == "soniq_django" else None


def _ids(messages) -> list[str]:
    return [message.id for message in messages]


def test_writes_routed_where_migrations_are_refused_is_w005():
    assert "soniq.W005" not in _ids(check_settings())
    with override_settings(DATABASE_ROUTERS=[KeepSoniqOut()]):
        assert _ids(check_settings()).count("soniq.W005") == 1
        # The write alias still holds soniq's tables as far as checks go.
        assert soniq_aliases(reads=False) == ["default"]


@pytest.mark.django_db
def test_the_database_checks_skip_an_alias_the_routers_keep_soniq_out_of():
    with override_settings(DATABASE_ROUTERS=[KeepSoniqOut()]):
        assert check_database(databases=["default"]) == []


def test_admin_actions_write_to_the_routers_write_alias_unless_the_admin_pinned_one():
    with override_settings(DATABASE_ROUTERS=[ReadElsewhere()]):
        listed = Job.objects.all()
        assert listed.db == "replica"  # where the changelist read the rows
        assert write_alias(listed) == "default"
        assert write_alias(Job.objects.using("pinned").all()) == "pinned"


def test_commands_default_to_the_routers_alias_and_refuse_an_unknown_one():
    with override_settings(DATABASE_ROUTERS=[ReadElsewhere()]):
        assert database_alias({"database": None}) == "default"
        with pytest.raises(CommandError, match="not in settings.DATABASES"):
            database_alias({"database": None}, reads=True)  # "replica" is no alias here
        assert database_alias({"database": "default"}, reads=True) == "default"


@pytest.mark.django_db(transaction=True)
def test_enqueue_inside_a_transaction_on_the_one_database_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with transaction.atomic():
            enqueue("tests.add", {"a": 1})
            add.enqueue(a=1)
            add.configure(priority=1).enqueue(a=1)
            bulk_enqueue([JobRequest("tests.add", {"a": 1})])
            tasks.add.enqueue(1, 2)
        enqueue("tests.add", {"a": 1})  # and outside any
    assert Job.objects.count() == 6

"""Fixtures of the SQL API tests."""

import pytest

from tests.support.sql import raw


@pytest.fixture
def committed_db(django_db_setup):
    """The test database, for raw connections that commit; emptied of jobs before and after.

    Cheaper than ``django_db(transaction=True)``, which flushes every table. Mark
    the test ``django_db`` as well: pytest-django sets the database up only for
    tests that carry that marker.
    """

    def empty():
        with raw() as conn:
            conn.execute("DELETE FROM soniq_jobs")
            conn.execute("DELETE FROM soniq_dead_letter_jobs")

    empty()
    yield
    empty()


@pytest.fixture
def flow_db(committed_db):
    """No job, queue setting, start or hold before and after the test (flow-control tests).

    The tests leave live claims, which the protection trigger keeps from a
    plain DELETE: the gate is opened for this connection's deletes.
    """
    def empty():
        with raw() as conn:
            conn.execute("SELECT set_config('soniq.fenced_write', 'on', false)")
            for table in ("soniq_jobs", "soniq_queue_settings", "soniq_queue_starts",
                          "soniq_queue_holds"):
                conn.execute(f"DELETE FROM {table}")

    empty()
    yield
    empty()

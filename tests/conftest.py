"""Suite-wide fixtures.

Every test id carries the backend it ran on (``test_x[sqlite]``,
``test_x[postgresql]``) so one report shows that both databases ran.
"""

import os
import platform

import django
import pytest
from django.conf import settings
from django.db import connection

from tests.support.worker_processes import Children, database_url
from tests.support.workers import RunLog, soniq

BACKEND = settings.BACKEND


def pytest_report_header(config):
    # The first lines of every pass say what it ran on (scripts/run-tests
    # runs Django 5.2 and 6.0, each on both databases).
    from soniq_django.tasks_backend import TASKS_API

    return [f"soniq_django: Django {django.get_version()}, Python {platform.python_version()}, "
            f"Tasks API {TASKS_API}, database {BACKEND}"]


@pytest.fixture(autouse=True, params=[BACKEND], ids=[BACKEND])
def backend(request):
    """The database backend this test runs on: ``sqlite`` or ``postgresql``."""
    return request.param


# Worker tests' fixtures; none autouse: a module that wants ``fast`` for
# every test says ``pytest.mark.usefixtures("fast")``.


@pytest.fixture
def fast(settings):
    """``SONIQ = FAST`` (tests/support/workers.py) for the test."""
    soniq(settings)
    return settings


@pytest.fixture
def run_log(tmp_path, monkeypatch) -> RunLog:
    """The test's run log: ``SONIQ_TEST_RUN_LOG`` names it, for this process and its children."""
    path = tmp_path / "runs.log"
    monkeypatch.setenv("SONIQ_TEST_RUN_LOG", str(path))
    return RunLog(path)


@pytest.fixture
def children(tmp_path, run_log):
    """``manage.py`` children on the test database, writing to the test's run log; killed at
    the end."""
    pool = Children(tmp_path, database_url(connection))
    try:
        yield pool
    finally:
        pool.kill_all()


def pytest_collection_modifyitems(config, items):
    # Behaviour that exists on one backend only (SQL functions and LISTEN on
    # PostgreSQL; SQLite's collation probe and write lock) runs in that
    # backend's pass and is deselected in the other, never skipped.
    # SONIQ_TEST_DESELECT (comma-separated markers) deselects more:
    # scripts/run-tests sets it to version_independent for the Django 6.0
    # passes, whose tests of that mark run in the Django 5.2 passes.
    other = "sqlite_only" if BACKEND == "postgresql" else "postgresql_only"
    extra = {m.strip() for m in os.environ.get("SONIQ_TEST_DESELECT", "").split(",") if m.strip()}
    known = {line.split(":", 1)[0].strip() for line in config.getini("markers")}
    if extra - known:  # a typo would silently deselect nothing
        raise pytest.UsageError(f"SONIQ_TEST_DESELECT names unknown markers: "
                                f"{', '.join(sorted(extra - known))}")
    markers = {other, *extra}
    keep, drop = [], []
    for item in items:
        (drop if any(item.get_closest_marker(m) for m in markers) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep

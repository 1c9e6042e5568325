"""Suite-wide fixtures.

Every test id carries the backend it ran on (``test_x[sqlite]``,
``test_x[postgresql]``) so one report shows that both databases ran.
"""

import pytest
from django.conf import settings

BACKEND = settings.BACKEND


@pytest.fixture(autouse=True, params=[BACKEND], ids=[BACKEND])
def backend(request):
    """The database backend this test runs on: ``sqlite`` or ``postgresql``."""
    return request.param


def pytest_collection_modifyitems(config, items):
    # PostgreSQL-only behaviour (SQL functions, LISTEN/NOTIFY) runs in the
    # PostgreSQL pass; in the SQLite pass it is deselected, not skipped.
    if BACKEND == "postgresql":
        return
    keep, drop = [], []
    for item in items:
        (drop if item.get_closest_marker("postgresql_only") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep

"""Fixtures of the deployment tests: one PgBouncer for the session, child processes per test.

The PgBouncer serves the test database under three names:

- ``soniq_tx``: transaction pooling, 6 server connections (what the
  children's ``default`` database goes through);
- ``soniq_session``: session pooling, for ``SONIQ["LISTEN_DATABASE"]``;
- ``soniq_one``: transaction pooling with a single server connection, so
  that every client of it meets every other one's session state.

It is stopped before pytest-django drops the test database (it holds server
connections to it). A machine without the pgbouncer binary skips these
tests, or fails them under CI=true.
"""

import pytest
from django.db import connections

from tests.support.ci import unavailable
from tests.support.pgbouncer import PgBouncer, PgBouncerUnavailable, Pool, Server
from tests.support.processes import Processes

SETTINGS = "tests.deploy.settings"


@pytest.fixture(scope="session")
def bouncer(django_db_setup):
    db = connections["default"].settings_dict
    server = Server(db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432), db["USER"] or "postgres",
                    db["PASSWORD"] or "")
    pools = [Pool("soniq_tx", db["NAME"], "transaction", 6),
             Pool("soniq_session", db["NAME"], "session", 10),
             Pool("soniq_one", db["NAME"], "transaction", 1)]
    try:
        instance = PgBouncer(server, pools)
    except PgBouncerUnavailable as error:
        unavailable(f"the deployment tests need PgBouncer: {error}")
    with instance:
        yield instance


@pytest.fixture
def processes(tmp_path, bouncer, run_log):
    """Children whose ``default`` database is the transaction pool ``soniq_tx``."""
    pool = Processes(tmp_path, SETTINGS, {
        "SONIQ_WORKER_DATABASE_URL": bouncer.url("soniq_tx"),
        "SONIQ_TEST_RUN_LOG": str(run_log.path),
    })
    try:
        yield pool
    finally:
        pool.cleanup()

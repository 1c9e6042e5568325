"""Telling a pooler apart (soniq_django.pooling), and the checks that name the settings.

PgBouncer gives its clients a cancel key of its own: the backend pid the
client is told is not the server session's ``pg_backend_pid()``. In session
mode too: both count as pooled. ``manage.py check --database default``,
whose database goes through the transaction pool and sets none of the
settings a pooler needs, warns with the settings' names.
"""

import psycopg
import pytest
from django.db import connection

from soniq_django.pooling import pooled

pytestmark = pytest.mark.postgresql_only


@pytest.mark.parametrize("pool", ["soniq_tx", "soniq_session"])
def test_a_connection_through_pgbouncer_is_pooled(bouncer, pool):
    with psycopg.connect(bouncer.url(pool), autocommit=True) as raw:
        assert pooled(raw) is True
        assert pooled(raw) is True  # remembered


@pytest.mark.django_db
def test_a_connection_straight_to_the_server_is_not():
    connection.ensure_connection()
    assert pooled(connection.connection) is False


def _check(processes, **soniq) -> str:
    child = processes.start("manage.py", "check", "--database", "default", **soniq)
    assert child.wait(60) == 0, child.log()[-3000:]
    return child.log()


def test_the_database_check_names_the_settings_a_transaction_pool_needs(processes):
    output = _check(processes)
    assert "soniq.W012" in output and "DISABLE_SERVER_SIDE_CURSORS" in output
    assert "soniq.W010" in output and "SONIQ['LISTEN_DATABASE']" in output
    assert "soniq.W011" not in output
    assert "soniq.W011" in _check(processes, PREPARED_STATEMENTS=True)

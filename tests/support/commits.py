"""Shared helpers for the tests of a COMMIT whose answer is lost: an atomic job's, an atomic step's.

Three ways to lose it: ``lose_the_first_job_thread_commit`` makes the first COMMIT of a job
thread's own connection err after it landed (or instead of it), in process, on both
databases; ``slow_commit`` (PostgreSQL) makes one COMMIT last 2 s and name its backend, so
that a test can terminate that backend while the COMMIT runs (``backend_in_commit``);
``cut_after`` (PostgreSQL) loses the COMMIT in a partition: the server never hears of it,
and its backend stays idle in the transaction, holding its locks, until the server ends it
or the test calls ``release_cut_sockets``.
"""

import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import OperationalError, connection, connections

from soniq_django.worker import Worker


def lose_the_first_job_thread_commit(monkeypatch, worker: Worker, *, land: bool,
                                     seen: list) -> None:
    """The first COMMIT of a job thread's own connection (not the worker's shared one) is made
    (``land``) or not, and then errs as a lost connection does; ``seen`` gets its alias."""
    wrapper = type(connections["default"])
    real = wrapper.commit

    def commit(self):
        if (not seen and threading.current_thread().name.startswith("soniq-job")
                and self is not worker.shared._wrapper):
            seen.append(self.alias)
            if land:
                real(self)
            raise OperationalError("server closed the connection unexpectedly")
        return real(self)

    monkeypatch.setattr(wrapper, "commit", commit)


@contextmanager
def slow_commit(mark: str, when: str) -> Iterator[None]:
    """While inside: a COMMIT of a transaction that inserted a ``testapp_effect`` row matching
    ``when`` (a trigger's WHEN condition on NEW) takes 2 s, and its backend names itself
    ``mark`` (application_name, a local setting: until that transaction ends) before it
    sleeps. PostgreSQL only. A COMMIT seen in pg_stat_activity is not necessarily the one
    wanted: the worker's shared connection commits its registration as it starts, and on a
    loaded machine the WAL flush of that COMMIT lasts long enough to be caught; the name tells
    them apart."""
    name = "test_slow_commit_" + mark.replace("-", "_")
    with connection.cursor() as cursor:
        cursor.execute(f"""
CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM set_config('application_name', '{mark}', true);
  PERFORM pg_sleep(2);
  RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER {name} AFTER INSERT ON testapp_effect
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
  WHEN ({when}) EXECUTE FUNCTION {name}();
""")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER IF EXISTS {name} ON testapp_effect; "
                           f"DROP FUNCTION IF EXISTS {name}()")


def backend_in_commit(mark: str) -> int | None:
    """The pid of the backend whose COMMIT runs ``slow_commit``'s trigger (it named itself
    ``mark`` there), if one does; at most one may."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                       "AND application_name = %s AND state = 'active' AND query = 'COMMIT'",
                       [mark])
        found = cursor.fetchall()
    assert len(found) <= 1, found  # one job, one first attempt: one such COMMIT
    return found[0][0] if found else None


#: The real sockets of connections cut by ``cut_after``, kept open so that the server sees no
#: end of them: their backends stay idle in transaction, as behind a partition.
CUT_SOCKETS: list[int] = []


def cut_after(connection, marker: str) -> None:
    """Once a statement holding ``marker`` has run on ``connection`` (a Django wrapper), cut it.

    The client's socket is swapped for a dead one (a socket pair whose other end is closed)
    and the real socket is kept open in ``CUT_SOCKETS``: the COMMIT that follows fails on the
    client, and the server never hears of it.
    """
    def cut(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if marker in sql:
            wrapper = context["connection"]
            wrapper.execute_wrappers.remove(cut)
            fd = wrapper.connection.pgconn.socket
            CUT_SOCKETS.append(os.dup(fd))
            alive, dead = socket.socketpair()
            dead.close()
            os.dup2(alive.fileno(), fd)
            alive.close()
        return result

    connection.execute_wrappers.append(cut)


def release_cut_sockets() -> None:
    """Close the real sockets ``cut_after`` kept: the server then ends those backends."""
    for fd in CUT_SOCKETS:
        os.close(fd)
    CUT_SOCKETS.clear()

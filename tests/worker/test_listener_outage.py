"""The listener during an outage: one warning, jittered retries, a line when it is back.

A listener whose database is away retried at 0.1, 0.2, 0.4 … 5 s and
logged a WARNING at every retry, with the same pauses on every worker, so
a fleet came back in lockstep and filled the log. Now it warns once an
outage, retries at DEBUG with the worker connection's jittered backoff,
and says when it listens again.

The outage is real: ``LISTEN_DATABASE`` names an alias whose port has no
server, so each attempt is a refused TCP connection. PostgreSQL only: on
SQLite there is no listener.
"""

import logging
import socket
import threading
import time

import pytest
from django.db import connections
from django.test import override_settings

from soniq_django.worker.connection import FIRST_RETRY_SECONDS, MAX_RETRY_SECONDS, Backoff
from soniq_django.worker.wakeup import Listener

ALIAS = "listener_outage"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def away_alias():
    """An alias like ``default`` whose server does not answer (a port nobody listens on)."""
    settings = dict(connections.settings["default"], PORT=_closed_port(), HOST="127.0.0.1")
    settings["OPTIONS"] = dict(settings.get("OPTIONS") or {}, connect_timeout=1)
    connections.settings[ALIAS] = settings
    try:
        yield ALIAS
    finally:
        if hasattr(connections._connections, ALIAS):
            connections[ALIAS].close()
            delattr(connections._connections, ALIAS)
        del connections.settings[ALIAS]


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgresql_only
def test_an_outage_is_one_warning_then_debug_retries(away_alias, caplog):
    stop, wake = threading.Event(), threading.Event()
    with override_settings(SONIQ={"LISTEN_DATABASE": away_alias}):
        listener = Listener("default", None, wake, stop)
        with caplog.at_level(logging.DEBUG, logger="soniq_django.worker"):
            listener.start()
            time.sleep(2.0)  # about five attempts: 0.1 + 0.2 + 0.4 + 0.8 s at most
            stop.set()
            listener.join(10)
    assert not listener.is_alive()
    records = [r for r in caplog.records if r.name == "soniq_django.worker" and "listener" in
               r.getMessage()]
    warnings = [r for r in records if r.levelno >= logging.WARNING]
    retries = [r for r in records if r.levelno == logging.DEBUG and "retrying in" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "cannot connect" in warnings[0].getMessage()
    assert "polls every" in warnings[0].getMessage()
    assert len(retries) >= 2, [r.getMessage() for r in records]
    assert not listener.ready.is_set()


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgresql_only
def test_it_says_when_it_listens_again(away_alias, caplog):
    stop, wake = threading.Event(), threading.Event()
    with override_settings(SONIQ={"LISTEN_DATABASE": away_alias}):
        listener = Listener("default", None, wake, stop)
        with caplog.at_level(logging.INFO, logger="soniq_django.worker"):
            listener.start()
            time.sleep(0.5)
            # The server comes back: the alias now points where ``default`` does.
            connections.settings[away_alias]["PORT"] = connections.settings["default"]["PORT"]
            connections.settings[away_alias]["HOST"] = connections.settings["default"]["HOST"]
            assert listener.ready.wait(15), "the listener never listened once the server was back"
            stop.set()
            listener.join(10)
    lines = [r.getMessage() for r in caplog.records if r.name == "soniq_django.worker"]
    assert sum("cannot connect" in line for line in lines) == 1, lines
    assert any("again, after" in line for line in lines), lines


def test_backoff_doubles_to_the_cap_with_jitter():
    backoff = Backoff()
    limits = []
    limit = FIRST_RETRY_SECONDS
    pauses = []
    for _ in range(12):
        limits.append(limit)
        pauses.append(backoff.pause())
        limit = min(limit * 2, MAX_RETRY_SECONDS)
    for pause, top in zip(pauses, limits):
        assert top / 2 <= pause <= top
    # Jittered: ten pauses at the cap are not all the same length.
    assert len({round(p, 6) for p in (Backoff().pause() for _ in range(10))}) > 1
    backoff.reset()
    assert backoff.pause() <= FIRST_RETRY_SECONDS

"""Telling a transaction pooler apart before a LISTEN (listen.transaction_pooled).

A LISTEN taken through a transaction pooler stays on whichever server
session the pooler used, and taking it off again means reaching that one
session among the pool's -- which a busy pool may not hand back in time.
So the worker's listener and ``wait_for_job`` prove the pooler first and
then LISTEN on nothing. Here the pool never hands the session back in time
(``UNLISTEN_TRIES`` = 0): a self-test that LISTENed would leave its LISTEN
behind, and ``bouncer.listening`` would hear it.

The connections are made in-process through the ``server_binding`` alias,
pointed at a pool of the session's PgBouncer (tests/deploy/conftest.py).
"""

import threading
import time

import pytest
from django.db import connections

from soniq_django import listen, waiting
from soniq_django.worker import wakeup
from tests.support.workers import soniq, wait_until

pytestmark = [pytest.mark.postgresql_only,
              pytest.mark.django_db(transaction=True, databases=["default", "server_binding"])]


@pytest.fixture
def through(monkeypatch, bouncer):
    """Point the ``server_binding`` alias at a pool of the PgBouncer (every thread's wrapper)."""
    def point(pool: str) -> str:
        entry = {**connections.settings["server_binding"], "HOST": "127.0.0.1",
                 "PORT": str(bouncer.port), "NAME": pool}
        monkeypatch.setitem(connections.settings, "server_binding", entry)
        monkeypatch.setattr(connections["server_binding"], "settings_dict", entry)
        return "server_binding"
    return point


@pytest.mark.parametrize(("pool", "expected"), [
    ("soniq_tx", True), ("soniq_one", True), ("soniq_session", False)])
def test_a_transaction_pool_is_proved_and_a_session_pool_is_not(through, pool, expected):
    alias = through(pool)
    raw = listen.new_connection(alias)
    try:
        assert listen.transaction_pooled(raw, alias) is expected
        assert listen.transaction_pooled(raw, alias) is expected  # and again, same connection
    finally:
        listen.close(raw)


def test_a_connection_straight_to_the_server_is_not_pooled():
    raw = listen.new_connection("default")
    try:
        assert listen.transaction_pooled(raw, "default") is False
    finally:
        listen.close(raw)


def test_a_waiter_through_a_transaction_pool_takes_no_listen(monkeypatch, settings, caplog,
                                                            through, bouncer):
    monkeypatch.setattr(waiting, "_verdicts", {})
    monkeypatch.setattr(waiting, "_warned_deaf", set())
    monkeypatch.setattr(listen, "UNLISTEN_TRIES", 0)  # the pool never hands the session back
    soniq(settings, LISTEN_DATABASE=through("soniq_tx"))
    raw = listen.new_connection("server_binding")
    try:
        with caplog.at_level("WARNING", logger="soniq_django"):
            assert waiting._hears(raw, "server_binding", "default", time.monotonic() + 10) is False
    finally:
        listen.close(raw)
    assert not bouncer.listening("soniq_tx", listen.PROBE_CHANNEL)
    [warning] = [r.getMessage() for r in caplog.records if "does not hear NOTIFY" in r.getMessage()]
    assert waiting.POOLED in warning and "SONIQ['LISTEN_DATABASE']" in warning


def test_a_worker_listener_through_a_transaction_pool_takes_no_listen(monkeypatch, settings,
                                                                     caplog, through, bouncer):
    monkeypatch.setattr(listen, "UNLISTEN_TRIES", 0)  # the pool never hands the session back
    soniq(settings, LISTEN_DATABASE=through("soniq_tx"), POLL_INTERVAL=5)
    wake, stop = threading.Event(), threading.Event()
    listener = wakeup.Listener("default", None, wake, stop)
    with caplog.at_level("WARNING", logger="soniq_django.worker"):
        listener.start()
        try:
            wait_until(listener.deaf.is_set, 20, "the listener's self-test to fail")
        finally:
            stop.set()
            listener.interrupt()
            listener.join(10)
    for channel in (wakeup.CHANNEL, listen.PROBE_CHANNEL, listener.stop_channel):
        assert not bouncer.listening("soniq_tx", channel), channel
    [warning] = [r.getMessage() for r in caplog.records if "does not hear NOTIFY" in r.getMessage()]
    assert "it goes through a transaction pooler" in warning


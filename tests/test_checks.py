"""System checks: one test per message id."""

import io

import pytest
from django.core import checks
from django.db import connection
from django.test import override_settings

from soniq_django.checks import check_database, check_queues, check_settings


def ids(messages):
    return sorted(message.id for message in messages)


def test_default_configuration_is_clean_apart_from_backend_advice():
    assert [m for m in check_settings() if m.id != "soniq.W002"] == []


@override_settings(SONIQ=["not", "a", "dict"])
def test_soniq_must_be_a_dict():
    assert ids(check_settings()) == ["soniq.E001"]


@override_settings(SONIQ={"LEASE_SECOND": 30, "POLL": 1})
def test_unknown_keys_are_named_with_the_known_ones_as_hint():
    [message] = [m for m in check_settings() if m.id == "soniq.E002"]
    assert "LEASE_SECOND" in message.msg and "POLL" in message.msg
    assert "LEASE_SECONDS" in message.hint


@pytest.mark.parametrize(
    "config",
    [{"LEASE_SECONDS": 0}, {"LEASE_SECONDS": "30"}, {"HEARTBEAT_SECONDS": True},
     {"RESULT_TTL": -1}, {"DEFAULT_PRIORITY": 1.5}, {"DEFAULT_MAX_ATTEMPTS": 0},
     {"JOB_TIMEOUT_SECONDS": 0}, {"DEFAULT_QUEUE": ""}, {"RETRY_MAX_SECONDS": None},
     {"PREPARED_STATEMENTS": "yes"}, {"PREPARED_STATEMENTS": 1}, {"IMPORTS": "shop.tasks"},
     {"IMPORTS": ["shop.tasks", 3]}, {"IMPORTS": [""]}, {"IMPORTS": None},
     {"UNKNOWN_JOB_GRACE_SECONDS": -1}, {"UNKNOWN_JOB_GRACE_SECONDS": "600"},
     {"MAX_PAYLOAD_BYTES": 0}, {"MAX_PAYLOAD_BYTES": "1MB"}, {"MAX_PAYLOAD_BYTES": True},
     {"MAX_PAYLOAD_BYTES": 1.5e6}, {"REBUILD_INDEXES_AFTER_PIN": None},
     {"REBUILD_INDEXES_AFTER_PIN": 1}],
)
def test_bad_values(config):
    with override_settings(SONIQ=config):
        assert "soniq.E003" in ids(check_settings())


@pytest.mark.parametrize("value", [None, 1, 2**40])
def test_max_payload_bytes_takes_none_or_a_positive_whole_number(value):
    with override_settings(SONIQ={"MAX_PAYLOAD_BYTES": value}):
        assert "soniq.E003" not in ids(check_settings())


@pytest.mark.parametrize("value", [True, False])
def test_rebuild_indexes_after_pin_takes_a_bool(value):
    with override_settings(SONIQ={"REBUILD_INDEXES_AFTER_PIN": value}):
        assert "soniq.E003" not in ids(check_settings())


@pytest.mark.parametrize("value", [None, True, False])
def test_prepared_statements_takes_none_or_a_bool(value):
    with override_settings(SONIQ={"PREPARED_STATEMENTS": value}):
        assert "soniq.E003" not in ids(check_settings())


@override_settings(SONIQ={"IMPORTS": ["tests.testapp.tasks", "tests.no_such_module"],
                          "UNKNOWN_JOB_GRACE_SECONDS": 0})
def test_a_module_imports_names_that_cannot_be_imported():
    [message] = [m for m in check_settings() if m.id == "soniq.E009"]
    assert message.msg == ("SONIQ['IMPORTS'] names the module 'tests.no_such_module', which "
                           "cannot be imported (ModuleNotFoundError).")
    assert "python -c 'import tests.no_such_module'" in message.hint
    assert "soniq.E003" not in ids(check_settings())


@override_settings(SONIQ={"TASK_NAME_PATTERN": "([a-z"})
def test_invalid_pattern():
    assert "soniq.E004" in ids(check_settings())


@override_settings(SONIQ={"TASK_NAME_PATTERN": r"^[a-z]+$"})
def test_registered_names_must_match_the_pattern():
    messages = [m for m in check_settings() if m.id == "soniq.E007"]
    assert any("'tests.add'" in m.msg for m in messages)


@override_settings(SONIQ={"LEASE_SECONDS": 10, "HEARTBEAT_SECONDS": 8})
def test_heartbeat_too_close_to_the_lease():
    assert "soniq.W001" in ids(check_settings())


@override_settings(SONIQ={"REQUIRE_SQL_API": True})
def test_sql_api_expected_on_a_database_that_lacks_it():
    expected = [] if connection.vendor == "postgresql" else ["soniq.E008"]
    assert [i for i in ids(check_settings()) if i == "soniq.E008"] == expected


def test_sqlite_without_immediate_transactions_warns(settings):
    if connection.vendor != "sqlite":
        assert "soniq.W002" not in ids(check_settings())
        return
    assert "soniq.W002" not in ids(check_settings())  # the test settings use IMMEDIATE
    options = connection.settings_dict["OPTIONS"]
    saved = dict(options)
    options.pop("transaction_mode")
    try:
        assert "soniq.W002" in ids(check_settings())
    finally:
        options.update(saved)


@pytest.mark.django_db
def test_database_check_passes_when_migrated():
    assert check_database(databases=["default"]) == []


@pytest.mark.postgresql_only
@pytest.mark.django_db
@override_settings(SONIQ={"TASK_NAME_PATTERN": r"^[a-z_.]+$"})
def test_pattern_differing_from_the_database_level_setting_warns():
    assert ids(check_database(databases=["default"])) == ["soniq.W003"]
    name = connection.ops.quote_name(connection.settings_dict["NAME"])
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER DATABASE {name} SET soniq.task_name_pattern = '^[a-z_.]+$'")
    assert check_database(databases=["default"]) == []


@pytest.mark.django_db(transaction=True)
def test_unapplied_migrations_warn_but_not_the_migrate_that_applies_them():
    from django.core.management import call_command

    def migrate(*labels):
        output = io.StringIO()
        # migrate runs the database checks first, as manage.py migrate does.
        call_command("migrate", *labels, verbosity=1, skip_checks=False, stdout=output,
                     stderr=output)
        return output.getvalue()

    call_command("migrate", "soniq_django", "0004", verbosity=0)
    try:
        assert ids(check_database(databases=["default"])) == ["soniq.W004"]
        # A migrate of another app leaves soniq's pending: it still says so.
        assert "soniq.W004" in migrate("shop")
    finally:
        # The migrate that applies them neither stops at the warning nor prints it.
        applying = migrate("soniq_django")
    assert "Applying soniq_django.0005_throughput... OK" in applying
    assert "soniq.W004" not in applying
    assert check_database(databases=["default"]) == []


def test_checks_are_registered():
    assert check_settings in checks.registry.registry.registered_checks


@pytest.mark.parametrize(("value", "expected"), [
    (3, ["soniq.E003"]), ("nowhere", ["soniq.E010"]),
    ("default", [] if connection.vendor == "postgresql" else ["soniq.E010"]), (None, []),
])
def test_listen_database_names_a_postgresql_database(value, expected):
    with override_settings(SONIQ={"LISTEN_DATABASE": value}):
        found = [i for i in ids(check_settings()) if i in ("soniq.E003", "soniq.E010")]
    assert found == expected


@pytest.mark.postgresql_only
@pytest.mark.parametrize(("soniq", "expected"), [
    ({}, ["soniq.W010"]), ({"LISTEN_DATABASE": "default"}, ["soniq.W010"]),
    ({"LISTEN_DATABASE": "server_binding"}, []),
    ({"LISTEN_DATABASE": "server_binding", "PREPARED_STATEMENTS": True}, ["soniq.W011"]),
    ({"PREPARED_STATEMENTS": False}, ["soniq.W010"]),
])
def test_a_database_set_up_for_a_transaction_pooler_gets_pooler_advice(
        soniq, expected, monkeypatch):
    # DISABLE_SERVER_SIDE_CURSORS is Django's setting for a transaction pooler.
    monkeypatch.setitem(connection.settings_dict, "DISABLE_SERVER_SIDE_CURSORS", True)
    with override_settings(SONIQ=soniq):
        assert [i for i in ids(check_settings()) if i.startswith("soniq.W01")] == expected


@pytest.mark.postgresql_only
@pytest.mark.django_db(databases=["default", "server_binding"])
def test_the_database_check_finds_no_pooler_in_front_of_the_test_server():
    # Through PgBouncer it does: tests/deploy/test_pooler_checks.py.
    with override_settings(SONIQ={"PREPARED_STATEMENTS": True}):
        assert check_database(databases=["default", "server_binding"]) == []


# SONIQ["QUEUES"] (flow control) -------------------------------------------------


@pytest.mark.parametrize("queues", [
    {}, {"emails": {"concurrency": 5, "rate": "10/s"}}, {"a": {}}, {"b": {"rate": "3/m"}},
    {"c": {"concurrency": 1, "rate": None}, "d": {"rate": " 2 / h "}},
])
def test_good_queue_settings_are_clean(queues):
    with override_settings(SONIQ={"QUEUES": queues}):
        assert check_queues() == [] and "soniq.E002" not in ids(check_settings())


@pytest.mark.parametrize(("queues", "problem"), [
    (["emails"], "must be a dict"),
    ({"": {}}, "keys must be queue names"),
    ({3: {}}, "keys must be queue names"),
    ({"emails": 5}, "['emails'] must be a dict"),
    ({"emails": {"concurrency": 0}}, "['concurrency'] must be None or a whole number"),
    ({"emails": {"concurrency": True}}, "['concurrency'] must be None or a whole number"),
    ({"emails": {"concurrency": 2.5}}, "['concurrency'] must be None or a whole number"),
    ({"emails": {"rate": "10/d"}}, "['rate'] is not a rate"),
    ({"emails": {"rate": "0/s"}}, "['rate'] is not a rate"),
    ({"emails": {"rate": 10}}, "['rate'] is not a rate"),
    ({"emails": {"limit": 3}}, "unknown key(s): limit"),
])
def test_bad_queue_settings(queues, problem):
    with override_settings(SONIQ={"QUEUES": queues}):
        [message] = check_queues()
    assert message.id == "soniq.E011" and problem in message.msg
    assert "docs/settings.md" in message.hint


def test_the_queue_check_is_registered():
    assert check_queues in checks.registry.registry.registered_checks

"""One settings reader: a typed, frozen snapshot of settings.SONIQ."""

import ast
import dataclasses
import re
from pathlib import Path

import pytest
from django.test import override_settings

import soniq_django
from soniq_django.conf import KEYS, Settings, get_settings

PACKAGE = Path(soniq_django.__file__).parent
DOCS = PACKAGE.parent / "docs" / "settings.md"

# SPEC §9 (and docs/settings.md for the keys SPEC leaves open).
SPEC_DEFAULTS = {
    "LEASE_SECONDS": 30, "HEARTBEAT_SECONDS": 10, "POLL_INTERVAL": 5, "RESULT_TTL": 300,
    "TASK_NAME_PATTERN": r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$", "DEFAULT_QUEUE": "default",
    "DEFAULT_PRIORITY": 100, "DEFAULT_MAX_ATTEMPTS": 4, "RETRY_BASE_SECONDS": 2,
    "RETRY_MAX_SECONDS": 3600, "JOB_TIMEOUT_SECONDS": None, "REQUIRE_SQL_API": False,
    "PREPARED_STATEMENTS": None, "IMPORTS": (), "UNKNOWN_JOB_GRACE_SECONDS": 600,
    "LISTEN_DATABASE": None, "MAX_PAYLOAD_BYTES": 1024 * 1024, "STEP_MAX_BYTES": 64 * 1024,
    "QUEUES": {},
    "METRICS_ACCESS": "staff", "METRICS_TOKEN": None, "METRICS_CACHE_SECONDS": 10,
    "METRICS_MAX_QUEUES": 100, "REBUILD_INDEXES_AFTER_PIN": True,
}


@override_settings(SONIQ={})
def test_every_key_has_the_pinned_default():
    assert {key: getattr(get_settings(), key) for key in KEYS} == SPEC_DEFAULTS


def test_the_keys_are_the_documented_ones_in_the_documented_order():
    documented = re.findall(r"^\| `([A-Z_]+)` \|", DOCS.read_text(), flags=re.MULTILINE)
    assert tuple(documented) == KEYS


def test_the_snapshot_is_frozen_and_slotted():
    snapshot = get_settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.LEASE_SECONDS = 1
    assert not hasattr(snapshot, "__dict__")


def test_reading_twice_gives_the_same_snapshot():
    assert get_settings() is get_settings()


def test_override_settings_is_followed_and_undone():
    before = get_settings()
    with override_settings(SONIQ={"LEASE_SECONDS": 1, "DEFAULT_QUEUE": "mail"}):
        inside = get_settings()
        assert (inside.LEASE_SECONDS, inside.DEFAULT_QUEUE) == (1, "mail")
        assert inside.RESULT_TTL == 300  # the rest keep their defaults
        with override_settings(SONIQ={"LEASE_SECONDS": 2}):
            assert get_settings().LEASE_SECONDS == 2
            assert get_settings().DEFAULT_QUEUE == "default"
        assert get_settings().LEASE_SECONDS == 1
    assert get_settings() == before


def test_the_settings_fixture_is_followed(settings):
    settings.SONIQ = {"POLL_INTERVAL": 0.5}
    assert get_settings().POLL_INTERVAL == 0.5
    settings.SONIQ = {"POLL_INTERVAL": 7}
    assert get_settings().POLL_INTERVAL == 7


def test_other_settings_changes_keep_the_snapshot():
    before = get_settings()
    with override_settings(TIME_ZONE="Europe/Paris"):
        assert get_settings() is before


@override_settings(SONIQ={"LEASE_SECOND": 30, "LEASE_SECONDS": 9, 3: "x"})
def test_unknown_keys_are_kept_for_the_checks_and_never_fail_a_read():
    snapshot = get_settings()
    assert snapshot.LEASE_SECONDS == 9
    assert snapshot.configured == {"LEASE_SECOND", "LEASE_SECONDS", 3}


@pytest.mark.parametrize("value", [["not", "a", "dict"], None, "LEASE_SECONDS"])
def test_a_soniq_that_is_not_a_dict_reads_as_the_defaults(value):
    with override_settings(SONIQ=value):
        assert get_settings() == Settings(is_dict=False)


def _reads_soniq(path: Path) -> bool:
    """Whether the module reads ``settings.SONIQ`` (an attribute or a getattr)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr == "SONIQ":
            return True
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "getattr" and len(node.args) > 1
                and isinstance(node.args[1], ast.Constant) and node.args[1].value == "SONIQ"):
            return True
    return False


def test_only_conf_reads_settings_soniq():
    readers = sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
                     if path.name != "conf.py" and _reads_soniq(path))
    assert readers == [], f"modules reading settings.SONIQ themselves: {readers}"
    assert _reads_soniq(PACKAGE / "conf.py")


def test_the_default_attempt_limit_is_one_constant_everywhere():
    import inspect

    from soniq_django import enqueue
    from soniq_django.conf import DEFAULT_MAX_ATTEMPTS
    from soniq_django.models import Job, RecurringJob
    from soniq_django.owned import _store
    from soniq_django.producer.request import JobRequest

    assert DEFAULT_MAX_ATTEMPTS == 4  # SPEC §5 and §9
    assert JobRequest("a.b").max_attempts == DEFAULT_MAX_ATTEMPTS
    assert inspect.signature(enqueue).parameters["max_attempts"].default == DEFAULT_MAX_ATTEMPTS
    assert Settings().DEFAULT_MAX_ATTEMPTS == DEFAULT_MAX_ATTEMPTS
    for model in (Job, RecurringJob):
        field = model._meta.get_field("max_attempts")
        db_default = getattr(field.db_default, "value", field.db_default)  # Value(4) or 4
        assert (field.default, db_default) == (DEFAULT_MAX_ATTEMPTS,) * 2
    assert _store.DEFAULT_MAX_ATTEMPTS is DEFAULT_MAX_ATTEMPTS
    literal = re.compile(r"(?i)max_attempts.*[=:]\s*4\b")  # "default=4", "= 4", ": int = 4"
    found = [f"{path.relative_to(PACKAGE)}:{number}"
             for path in sorted(PACKAGE.rglob("*.py")) if "migrations" not in path.parts
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if literal.search(line) and not line.lstrip().startswith("#")]
    assert [hit.partition(":")[0] for hit in found] == ["conf.py"], found

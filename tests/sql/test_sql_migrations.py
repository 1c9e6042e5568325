"""The migrations that install the SQL files: each file loaded once; reversible."""

import collections
import io
import re

import pytest
from django.core.management import call_command
from django.db import connection, migrations
from django.db.migrations.loader import MigrationLoader

from soniq_django.sql import SQL_DIR, current, definitions, fill_schema

from tests.support.sql import (
    PUBLIC_FUNCTIONS, Roles, fetch, producer_api_functions, schema,
)

pytestmark = [pytest.mark.postgresql_only]


def _run_python_callables(operations):
    for operation in operations:
        if isinstance(operation, migrations.SeparateDatabaseAndState):
            yield from _run_python_callables(operation.database_operations)
        elif isinstance(operation, migrations.RunPython):
            yield operation.code
            if operation.reverse_code is not None:
                yield operation.reverse_code


def test_every_sql_file_is_loaded_by_exactly_one_migration():
    loader = MigrationLoader(None, ignore_no_migrations=True)
    loaded = collections.Counter()
    for (app, _name), migration in loader.disk_migrations.items():
        if app != "soniq_django":
            continue
        for function in _run_python_callables(migration.operations):
            if hasattr(function, "sql_file"):
                loaded[function.sql_file] += 1
            if hasattr(function, "sqlite_file"):  # SQLite's twins, under sql/sqlite/
                loaded[f"sqlite/{function.sqlite_file}"] += 1
    on_disk = {path.relative_to(SQL_DIR).as_posix() for path in SQL_DIR.rglob("*.sql")}
    on_disk.discard("current.sql")  # generated for reading (test below), never executed
    assert {"producer_api_v1.sql", "producer_api_v1.down.sql", "producer_api_v2.sql",
            "producer_api_v2.down.sql"} <= on_disk
    assert set(loaded) == on_disk
    assert {name: count for name, count in loaded.items() if count != 1} == {}


def _installed() -> dict[str, bool]:
    """The producer API functions present in the soniq schema -> whether PUBLIC may run them."""
    rows = fetch(
        "SELECT p.proname, has_function_privilege('public', p.oid, 'EXECUTE') FROM pg_proc AS p "
        "WHERE p.pronamespace = current_schema()::regnamespace AND p.proname = ANY(%s)",
        [producer_api_functions()],
    )
    return dict(rows)


def _may_enqueue(role) -> bool:
    return fetch("SELECT has_function_privilege(%s, 'soniq_enqueue'::regproc, 'EXECUTE')",
                 [role])[0][0]


@pytest.fixture
def roles():
    made = Roles()
    yield made
    made.drop_all()


@pytest.mark.django_db(transaction=True)
def test_reversing_the_migration_drops_the_functions_and_reapplying_creates_them(roles):
    names = producer_api_functions()
    assert _installed() == dict.fromkeys(names, False)
    producer = roles.create("soniq_producer")
    call_command("soniq_grant", producer, stdout=io.StringIO())
    assert _may_enqueue(producer)
    try:
        call_command("migrate", "soniq_django", "0001", verbosity=0)
        assert _installed() == {}
        assert fetch("SELECT to_regclass('soniq_jobs') IS NOT NULL") == [(True,)]
    finally:
        call_command("migrate", "soniq_django", verbosity=0)
    assert _installed() == dict.fromkeys(names, False)
    # The grants went with the dropped functions (docs/sql-api.md says to grant again).
    assert not _may_enqueue(producer)
    job_id = fetch("SELECT soniq_enqueue('migrated.again', '{\"n\": 1}', unique_job => true)")[0][0]
    assert fetch("SELECT job_name FROM soniq_get_job(%s)", [job_id]) == [("migrated.again",)]
    assert set(PUBLIC_FUNCTIONS) <= set(names)


def _function_source(name: str) -> str | None:
    rows = fetch("SELECT p.prosrc FROM pg_proc AS p WHERE p.pronamespace = "
                 "current_schema()::regnamespace AND p.proname = %s", [name])
    assert len(rows) <= 1
    return rows[0][0] if rows else None


def _file_source(file_name: str, function: str) -> str:
    """The body (between $fn$ quotes) ``file_name`` gives ``function``, schema filled in."""
    text = (SQL_DIR / file_name).read_text(encoding="utf-8")
    start = text.index(f"FUNCTION {{schema}}.{function}(")
    body = text[start:].split("$fn$", 2)[1]
    return fill_schema(body, connection.ops.quote_name(schema()))


@pytest.mark.django_db(transaction=True)
def test_reversing_0010_restores_version_1_and_reapplying_gives_version_4(roles):
    v1 = _file_source("producer_api_v1.sql", "soniq_enqueue")
    v4 = _file_source("producer_api_v4.sql", "soniq_enqueue")
    assert v1 != v4
    assert _function_source("soniq_enqueue") == v4
    assert _function_source("soniq_enqueue_many") == _file_source(
        "producer_api_v3.sql", "soniq_enqueue_many")
    producer = roles.create("soniq_producer")
    call_command("soniq_grant", producer, stdout=io.StringIO())
    try:
        call_command("migrate", "soniq_django", "0009", verbosity=0)
        assert _function_source("soniq_enqueue") == v1
        assert _function_source("soniq_enqueue_many") is None
        assert set(_installed()) == set(producer_api_functions()) - {
            "soniq_enqueue_many", "soniq_enqueue_after", "soniq_enqueue_after_many",
            "soniq_enqueue_keyed", "soniq_enqueue_keyed_after", "soniq_enqueue_keyed_many"}
        # soniq_enqueue was replaced, not dropped: its grant and its revocation stay.
        assert _may_enqueue(producer)
        assert not any(_installed().values())
        job_id = fetch("SELECT soniq_enqueue('back.to_v1', '{\"n\": 1}')")[0][0]
        assert fetch("SELECT job_name FROM soniq_get_job(%s)", [job_id]) == [("back.to_v1",)]
    finally:
        call_command("migrate", "soniq_django", verbosity=0)
    assert _function_source("soniq_enqueue") == v4
    assert _installed() == dict.fromkeys(producer_api_functions(), False)
    assert _may_enqueue(producer)
    ids = fetch("SELECT soniq_enqueue_many('[{\"job_name\": \"again.v2\"}]')")[0][0]
    assert fetch("SELECT job_name FROM soniq_get_job(%s)", [ids[0]]) == [("again.v2",)]


@pytest.mark.django_db(transaction=True)
def test_reversing_0009_restores_version_1_and_reapplying_gives_version_2():
    v1 = _file_source("claim_protocol_v1.sql", "soniq_complete")
    v2 = _file_source("claim_protocol_v2.sql", "soniq_complete")
    assert v1 != v2 and "soniq_complete_many" in v2
    new = ("soniq_claim_many", "soniq_complete_many")
    assert _function_source("soniq_complete") == v2
    # The batched functions have version 13's bodies (0031), the claim version 14's (0034).
    assert _function_source("soniq_complete_many") == _file_source(
        _LATEST_BATCHED, "soniq_complete_many")
    assert _function_source("soniq_claim_many") == _file_source(
        _LATEST_CLAIM, "soniq_claim_many")
    try:
        call_command("migrate", "soniq_django", "0008", verbosity=0)
        assert _function_source("soniq_complete") == v1
        assert all(_function_source(name) is None for name in new)
        # Version 1 works again: claim, complete once.
        fetch("SELECT soniq_enqueue('back.to_v1')")
        job_id, generation = fetch(
            "SELECT job_id::text, generation FROM soniq_claim('w', 'nonce-1')")[0]
        complete = "SELECT soniq_complete(%s, 'w', %s, 'nonce-1', 'default', '1')"
        assert fetch(complete, [job_id, generation]) == [(True,)]
        assert fetch(complete, [job_id, generation]) == [(False,)]
    finally:
        call_command("migrate", "soniq_django", verbosity=0)
    assert _function_source("soniq_complete") == v2
    fetch("SELECT soniq_enqueue('again.v2')")
    job_id, generation = fetch(
        "SELECT job_id::text, generation FROM soniq_claim_many('w', ARRAY['nonce-2'])")[0]
    assert fetch("SELECT soniq_complete(%s, 'w', %s, 'nonce-2', 'default')",
                 [job_id, generation]) == [(True,)]


#: What migration 0018 (claim protocol v8) adds, and what it replaces: function -> the
#: released file whose body its reverse puts back. Going back to any earlier migration
#: reverses it too.
_ADDED_BY_0018 = ("soniq_queue_budget_v2", "soniq_reap_lapsed_v2",
                  "soniq_hold_slot", "soniq_release_hold", "soniq_renew_holds")
_REPLACED_BY_0018 = {"soniq_claim_many": "claim_protocol_v7.sql",
                     "soniq_complete_many": "claim_protocol_v7.sql",
                     "soniq_defer": "claim_protocol_v4.sql"}
#: What migration 0019 (claim protocol v9) adds, and replaces (function: released file).
_ADDED_BY_0019 = ("soniq_reap_lapsed_v3",)
_REPLACED_BY_0019 = {"soniq_claim_many": "claim_protocol_v8.sql"}
# 0020 also adds triggers (attempt history) and a table; these are its functions.
_ADDED_BY_0020 = ("soniq_attempt_ended_v1", "soniq_attempts_gone_v1")
# 0021 adds the trigger function that takes a job's trace context with it (tested below).
_ADDED_BY_0021 = ("soniq_job_trace_gone_v1",)
# 0025 adds the workflow triggers' functions and soniq_enqueue_after (producer API v5).
_ADDED_BY_0025 = ("soniq_settle_dependents_v1", "soniq_dependency_ended_v1",
                  "soniq_dependent_guard_v1", "soniq_enqueue_after")
# 0026 adds the trigger function that takes a job's workflow rows with it.
_ADDED_BY_0026 = ("soniq_workflow_rows_gone_v1",)
# 0027 adds soniq_enqueue_after_many (producer API v6).
_ADDED_BY_0027 = ("soniq_enqueue_after_many",)
# 0028 adds the durable steps' lookup, fenced record and purge trigger function.
_ADDED_BY_0028 = ("soniq_get_step", "soniq_record_step", "soniq_job_steps_gone_v1")
# 0029 adds the key triggers' functions, soniq_key_sweep/refresh and soniq_enqueue_keyed.
_ADDED_BY_0029 = ("soniq_key_limit_v1", "soniq_key_admit_v1", "soniq_key_moved_v1",
                  "soniq_key_deferred_v1", "soniq_key_hold_gone_v1", "soniq_key_sweep",
                  "soniq_key_refresh", "soniq_enqueue_keyed")
# 0030 adds a worker's registration, its heartbeat and the outcome of a claim (issue 32).
_ADDED_BY_0030 = ("soniq_register_worker", "soniq_worker_heartbeat", "soniq_claim_outcome")
# 0031 (claim protocol v13) adds the ordered lock of keys' rows and a queue budget that never
# waits for one, and replaces (function: the released file whose body its reverse puts back).
_ADDED_BY_0031 = ("soniq_key_lock_v1", "soniq_queue_budget_v3")
_REPLACED_BY_0031 = {"soniq_claim_many": "claim_protocol_v10.sql",
                     "soniq_complete_many": "claim_protocol_v11.sql",
                     "soniq_hold_slot": "claim_protocol_v8.sql",
                     "soniq_key_sweep": "claim_protocol_v12.sql"}
# 0032 parks the keyed jobs that reach their key later (a replay, a released dependent): the
# park, the dead letter's key, the workflow settle v2 behind the same triggers, and
# soniq_enqueue_keyed_after.
_ADDED_BY_0032 = ("soniq_key_park_v1", "soniq_key_dead_letter_v1", "soniq_settle_dependents_v2",
                  "soniq_dependency_ended_v2", "soniq_enqueue_keyed_many",
                  "soniq_enqueue_keyed_after")
# 0033 adds no function: it gives soniq_key_admit_v1 a new body (function: the released file
# whose body its reverse puts back).
_REPLACED_BY_0033 = {"soniq_key_admit_v1": "claim_protocol_v12.sql"}
#: What the migrations after 0026 add, each with its file (number, file, names), in order:
#: reversing one of them reverses those after it too.
# 0034 (claim protocol v14) adds the housekeeping's probe for lapsed leases from the start, and
# gives soniq_claim_many a new body (function: the released file its reverse puts back).
_ADDED_BY_0034 = ("soniq_settle_lapsed",)
_REPLACED_BY_0034 = {"soniq_claim_many": "claim_protocol_v13.sql"}
_LATER = (("0027", "producer_api_v6.sql", _ADDED_BY_0027), ("0028", "steps_v1.sql", _ADDED_BY_0028),
          ("0029", "claim_protocol_v12.sql", _ADDED_BY_0029),
          ("0030", "worker_registry_v1.sql", _ADDED_BY_0030),
          ("0031", "claim_protocol_v13.sql", _ADDED_BY_0031),
          ("0032", "key_park_v1.sql", _ADDED_BY_0032), ("0033", "key_order_v1.sql", ()),
          ("0034", "claim_protocol_v14.sql", _ADDED_BY_0034))
_ADDED_AFTER_0026 = tuple(name for _, _, names in _LATER for name in names)
#: What the migrations after 0026 give new bodies (reversing one of them puts the released ones back).
_REPLACED_AFTER_0026 = (*_REPLACED_BY_0031, *_REPLACED_BY_0033)
#: The file that last gave soniq_complete_many, soniq_hold_slot and soniq_key_sweep their
#: bodies (0031).
_LATEST_BATCHED = "claim_protocol_v13.sql"
#: The file that last gave soniq_claim_many its body (0034).
_LATEST_CLAIM = "claim_protocol_v14.sql"
#: The file that last gave each function replaced after 0026 its body.
_LATEST_BODY = {**{name: _LATEST_BATCHED for name in _REPLACED_BY_0031},
                "soniq_claim_many": _LATEST_CLAIM, "soniq_key_admit_v1": "key_order_v1.sql"}


def _latest_batched(function: str) -> str:
    """The body the last migration gave one of the batched functions."""
    return _file_source(_LATEST_BODY[function], function)


def _reversed_0031(functions: dict[str, str]) -> dict[str, str]:
    """``functions`` as they stand once 0031 (and so 0033) is reversed: the bodies they
    replaced put back."""
    replaced = {**_REPLACED_BY_0031, **_REPLACED_BY_0033}
    return {name: _file_source(replaced[name], name) if name in replaced
            else body for name, body in functions.items()}


def _added_from(number: str) -> dict[str, str]:
    """The functions migration ``number`` and those after it add (name: source), each as the
    last migration leaves it (soniq_key_sweep: version 13's, since 0031)."""
    return {name: _file_source(_LATEST_BODY.get(name, file), name)
            for later, file, names in _LATER if later >= number for name in names}


_REPLACED_BY_0020 = {"soniq_claim_many": "claim_protocol_v9.sql"}
#: What migration 0023 (claim protocol v11) replaces (function: released file).
_REPLACED_BY_0023 = {"soniq_complete_many": "claim_protocol_v8.sql"}
#: What migration 0024 (waiting and progress) adds: functions (its triggers and tables too).
_ADDED_BY_0024 = ("soniq_job_finished_v1", "soniq_job_progress_gone_v1", "soniq_set_progress")


#: What migration 0011 changes: (file that released the body it replaces, function).
_REPLACED_BY_0011 = (
    ("claim_protocol_v1.sql", "soniq_reap_lapsed_v1"),
    ("claim_protocol_v1.sql", "soniq_move_to_dead_letter_v1"),
    ("claim_protocol_v1.sql", "soniq_fail"),
    ("claim_protocol_v1.sql", "soniq_request_cancel"),
    ("claim_protocol_v1.sql", "soniq_claim"),
    ("producer_api_v2.sql", "soniq_enqueue"),
    ("producer_api_v2.sql", "soniq_enqueue_many"),
)
_ADDED_BY_0011 = ("soniq_requeue_v1", "soniq_default_max_attempts_v1")


def _version_3_source(function: str) -> str:
    name = "producer_api_v3.sql" if function.startswith("soniq_enqueue") else "claim_protocol_v3.sql"
    return _file_source(name, function)


#: Replaced since 0011 by 0017 (producer API v4), which going back to 0016 or below reverses.
_ENQUEUE_V4 = ("soniq_enqueue",)


def _latest_source(function: str) -> str:
    """What the last migration leaves: version 3's body, or version 4's for soniq_enqueue."""
    if function in _ENQUEUE_V4:
        return _file_source("producer_api_v4.sql", function)
    return _version_3_source(function)


@pytest.mark.django_db(transaction=True)
def test_reversing_0011_restores_the_released_bodies_and_reapplying_gives_version_3(roles):
    assert all(_function_source(function) == _latest_source(function)
               for _, function in _REPLACED_BY_0011 + tuple((None, f) for f in _ADDED_BY_0011))
    producer = roles.create("soniq_producer")
    call_command("soniq_grant", producer, stdout=io.StringIO())
    try:
        call_command("migrate", "soniq_django", "0010", verbosity=0)
        for released, function in _REPLACED_BY_0011:
            assert _function_source(function) == _file_source(released, function), function
        assert all(_function_source(function) is None for function in _ADDED_BY_0011)
        # Replaced, not dropped: the producer keeps its grant.
        assert _may_enqueue(producer)
        # Version 1's soniq_request_cancel is back, NULL for an unknown id and all.
        assert fetch("SELECT soniq_request_cancel(gen_random_uuid())") == [(None,)]
    finally:
        call_command("migrate", "soniq_django", verbosity=0)
    assert all(_function_source(function) == _latest_source(function)
               for _, function in _REPLACED_BY_0011)
    assert _may_enqueue(producer)
    assert fetch("SELECT soniq_request_cancel(gen_random_uuid())") == [(False,)]


def _soniq_functions() -> dict[str, str]:
    return dict(fetch("SELECT p.proname, p.prosrc FROM pg_proc AS p WHERE p.pronamespace = "
                      "current_schema()::regnamespace AND p.proname LIKE 'soniq%%'"))


@pytest.mark.django_db(transaction=True)
def test_reversing_0012_drops_soniq_defer_alone_and_reapplying_gives_it_back():
    v4 = _file_source("claim_protocol_v4.sql", "soniq_defer")
    before = _soniq_functions()
    # Version 8's body since 0018 (tested below), which going back to 0011 reverses.
    assert before["soniq_defer"] == _file_source("claim_protocol_v8.sql", "soniq_defer") != v4
    # Going back to 0011 also reverses 0013 (flow control, tested below),
    # 0016 (version 7's batched bodies), 0017 (soniq_enqueue v4) and 0018 (claim
    # protocol v8; all tested below).
    by_0013 = {"soniq_claim_many", "soniq_queue_budget_v1", "soniq_complete_many",
               "soniq_enqueue", *_ADDED_BY_0018, *_ADDED_BY_0019, *_ADDED_BY_0020,
               *_ADDED_BY_0021, *_ADDED_BY_0024,
                   *_ADDED_BY_0025, *_ADDED_BY_0026, *_ADDED_AFTER_0026, *_REPLACED_AFTER_0026}
    try:
        call_command("migrate", "soniq_django", "0011", verbosity=0)
        after = _soniq_functions()
        assert "soniq_defer" not in after
        assert {name: body for name, body in after.items() if name not in by_0013} == {
            name: body for name, body in before.items()
            if name != "soniq_defer" and name not in by_0013}
    finally:
        call_command("migrate", "soniq_django", verbosity=0)
    assert _soniq_functions() == before
    fetch("SELECT soniq_enqueue('again.v4', max_attempts => 1)")
    job_id, generation = fetch(
        "SELECT job_id::text, generation FROM soniq_claim('w', 'nonce-4')")[0]
    assert fetch("SELECT soniq_defer(%s, 'w', %s, 'nonce-4', 'default', 'not here')",
                 [job_id, generation]) == [(True,)]
    assert fetch("SELECT status, attempts FROM soniq_jobs WHERE id = %s", [job_id]) == [
        ("queued", 0)]


def test_current_sql_is_up_to_date():
    # Rewrite it with: python -m soniq_django.sql.current
    assert (SQL_DIR / "current.sql").read_text(encoding="utf-8") == current.render()


@pytest.mark.django_db
def test_current_sql_holds_exactly_the_functions_the_database_runs():
    installed = {name: source for name, source in fetch(
        "SELECT p.proname, p.prosrc FROM pg_proc AS p "
        "WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'soniq%%'")}
    text = (SQL_DIR / "current.sql").read_text(encoding="utf-8")
    documented = {name: statement for name, statement in definitions(text)
                  if re.match(r"CREATE (OR REPLACE )?FUNCTION ", statement)}
    assert set(documented) == set(installed)
    quoted = connection.ops.quote_name(schema())
    for name, statement in documented.items():
        assert installed[name] == fill_schema(statement.split("$fn$")[1], quoted), name


@pytest.mark.django_db(transaction=True)
def test_reversing_0013_restores_version_2s_claim_and_reapplying_gives_version_5():
    v2 = _file_source("claim_protocol_v2.sql", "soniq_claim_many")
    v5 = _file_source("claim_protocol_v5.sql", "soniq_claim_many")
    assert v2 != v5 and "soniq_queue_budget_v1" in v5
    before = _soniq_functions()
    # Version 14 (0034, tested below) has the body now; going back to 0012 reverses it too.
    assert before["soniq_claim_many"] == _file_source(_LATEST_CLAIM, "soniq_claim_many")
    assert "soniq_queue_budget_v1" in before
    try:
        call_command("migrate", "soniq_django", "0012", verbosity=0)
        after = _soniq_functions()
        assert after["soniq_claim_many"] == v2
        assert set(after) == set(before) - {"soniq_queue_budget_v1", *_ADDED_BY_0018,
                                            *_ADDED_BY_0019, *_ADDED_BY_0020,
                                            *_ADDED_BY_0021, *_ADDED_BY_0024,
                   *_ADDED_BY_0025, *_ADDED_BY_0026, *_ADDED_AFTER_0026}
        # 0017 reversed too: version 3's soniq_enqueue.
        assert after["soniq_enqueue"] == _file_source("producer_api_v3.sql", "soniq_enqueue")
        assert fetch("SELECT to_regclass('soniq_queue_settings'), "
                     "to_regclass('soniq_queue_starts')") == [(None, None)]
        # Version 2's claim works again.
        fetch("SELECT soniq_enqueue('back.to_v2')")
        assert len(fetch("SELECT * FROM soniq_claim_many('w', ARRAY['nonce-v2'])")) == 1
    finally:
        call_command("migrate", "soniq_django", verbosity=0)
    assert _soniq_functions() == before
    fetch("SELECT soniq_enqueue('again.v5', queue => 'paused')")
    fetch("INSERT INTO soniq_queue_settings (queue, paused) VALUES ('paused', true)")
    assert fetch("SELECT * FROM soniq_claim_many('w', ARRAY['nonce-v5'])") == []


def _claim_indexes() -> set[str]:
    return {name for (name,) in fetch(
        "SELECT indexname FROM pg_indexes WHERE tablename = 'soniq_jobs' "
        "AND indexname LIKE 'soniq_jobs_claim%%idx'")}


@pytest.mark.django_db(transaction=True)
def test_reversing_0014_restores_version_5s_claim_and_index_and_reapplying_gives_version_6():
    v5 = _file_source("claim_protocol_v5.sql", "soniq_claim_many")
    v6 = _file_source("claim_protocol_v6.sql", "soniq_claim_many")
    assert v5 != v6
    v6_indexes = {"soniq_jobs_claim_idx", "soniq_jobs_claim_now_idx",
                  "soniq_jobs_claim_scheduled_idx", "soniq_jobs_claim_due_idx"}
    # ... and 0018's (claim protocol v8, tested below).
    v8_indexes = v6_indexes | {"soniq_jobs_claim_queue_now_idx"}
    v14 = _file_source(_LATEST_CLAIM, "soniq_claim_many")  # since 0034 (tested below)
    before = _soniq_functions()
    assert before["soniq_claim_many"] == v14 and _claim_indexes() == v8_indexes
    try:
        call_command("migrate", "soniq_django", "0013", verbosity=0)
        after = _soniq_functions()
        assert after["soniq_claim_many"] == v5
        # soniq_complete_many: version 2's again (0016 reversed too).
        assert after["soniq_complete_many"] == _file_source(
            "claim_protocol_v2.sql", "soniq_complete_many")
        # soniq_enqueue: version 3's again (0017 reversed too).
        assert after["soniq_enqueue"] == _file_source("producer_api_v3.sql", "soniq_enqueue")
        changed = ("soniq_claim_many", "soniq_complete_many", "soniq_enqueue", *_ADDED_BY_0018,
                   *_REPLACED_BY_0018, *_ADDED_BY_0019, *_ADDED_BY_0020,
                   *_ADDED_BY_0021, *_ADDED_BY_0024,
                   *_ADDED_BY_0025, *_ADDED_BY_0026, *_ADDED_AFTER_0026, *_REPLACED_AFTER_0026)
        assert {n: b for n, b in after.items() if n not in changed} == {
            n: b for n, b in before.items() if n not in changed}
        assert not set(_ADDED_BY_0018 + _ADDED_BY_0019 + _ADDED_BY_0020
                       + _ADDED_BY_0021 + _ADDED_BY_0025 + _ADDED_BY_0026 + _ADDED_AFTER_0026) & set(after)
        assert _claim_indexes() == {"soniq_jobs_claim_idx", "soniq_jobs_claim_any_idx"}
        # Version 5's claim works again, a due scheduled job and all.
        fetch("SELECT soniq_enqueue('back.to_v5', run_at => now() - interval '1 second')")
        assert len(fetch("SELECT * FROM soniq_claim_many('w', ARRAY['nonce-v5'])")) == 1
    finally:
        call_command("migrate", "soniq_django", verbosity=0)
    assert _soniq_functions() == before and _claim_indexes() == v8_indexes
    fetch("SELECT soniq_enqueue('again.v6', run_at => now() - interval '1 second')")
    fetch("SELECT soniq_enqueue('again.v6_later', run_at => now() + interval '1 hour')")
    assert [row[1] for row in fetch(
        "SELECT job_id, job_name FROM soniq_claim_many('w', ARRAY['nonce-v6', 'nonce-v6b'])")] == [
        "again.v6"]


@pytest.mark.django_db(transaction=True)
def test_reversing_0016_restores_the_per_row_batches_and_reapplying_gives_version_7():
    v2 = _file_source("claim_protocol_v2.sql", "soniq_complete_many")
    v6 = _file_source("claim_protocol_v6.sql", "soniq_claim_many")
    v7 = {name: _file_source("claim_protocol_v7.sql", name)
          for name in ("soniq_claim_many", "soniq_complete_many")}
    assert v7["soniq_claim_many"] != v6 and v7["soniq_complete_many"] != v2
    before = _soniq_functions()
    # Version 13's since 0031 and 14's since 0034 (tested below), which going back to 0015
    # reverses.
    assert {name: before[name] for name in v7} == {
        name: _latest_batched(name) for name in v7}
    try:
        call_command("migrate", "soniq_django", "0015", verbosity=0)
        after = _soniq_functions()
        assert after["soniq_claim_many"] == v6 and after["soniq_complete_many"] == v2
        # 0017 and 0018 reversed too (tested below).
        assert after["soniq_enqueue"] == _file_source("producer_api_v3.sql", "soniq_enqueue")
        changed = {*v7, "soniq_enqueue", *_ADDED_BY_0018, *_REPLACED_BY_0018,
                   *_ADDED_BY_0019, *_ADDED_BY_0020,
                   *_ADDED_BY_0021, *_ADDED_BY_0024,
                   *_ADDED_BY_0025, *_ADDED_BY_0026, *_ADDED_AFTER_0026, *_REPLACED_AFTER_0026}
        assert {n: b for n, b in after.items() if n not in changed} == {
            n: b for n, b in before.items() if n not in changed}
        # The per-row bodies work again: claim two, complete both.
        fetch("SELECT soniq_enqueue('back.to_v6') FROM generate_series(1, 2)")
        claimed = fetch("SELECT job_id::text, generation, token, queue FROM "
                        "soniq_claim_many('w', ARRAY['nonce-v6a', 'nonce-v6b'])")
        assert len(claimed) == 2
        assert fetch("SELECT soniq_complete_many(%s::text[], 'w', %s::bigint[], %s::text[], "
                     "%s::text[], ARRAY[NULL, NULL]::jsonb[])",
                     [list(column) for column in zip(*claimed)]) == [([True, True],)]
    finally:
        call_command("migrate", "soniq_django", verbosity=0)
    assert _soniq_functions() == before
    fetch("SELECT soniq_enqueue('again.v7') FROM generate_series(1, 3)")
    claimed = fetch("SELECT job_id::text, generation, token, queue FROM "
                    "soniq_claim_many('w', ARRAY['nonce-v7a', 'nonce-v7b', 'nonce-v7c'])")
    assert len(claimed) == 3
    ids, generations, tokens, queues = (list(column) for column in zip(*claimed))
    assert fetch("SELECT soniq_complete_many(%s::text[], 'w', %s::bigint[], %s::text[], "
                 "%s::text[], ARRAY[NULL, NULL, NULL, NULL]::jsonb[])",
                 [ids + ids[:1], generations + generations[:1], tokens + tokens[:1],
                  queues + queues[:1]]) == [([True, True, True, False],)]


@pytest.mark.django_db(transaction=True)
def test_reversing_0017_restores_version_3s_enqueue_and_reapplying_gives_version_4(roles):
    v3 = _file_source("producer_api_v3.sql", "soniq_enqueue")
    v4 = _file_source("producer_api_v4.sql", "soniq_enqueue")
    assert v3 != v4
    before = _soniq_functions()
    assert before["soniq_enqueue"] == v4
    producer = roles.create("soniq_producer")
    call_command("soniq_grant", producer, stdout=io.StringIO())
    # Going back to 0016 reverses 0018 and 0019 too (tested below).
    changed = {"soniq_enqueue", *_ADDED_BY_0018, *_REPLACED_BY_0018, *_ADDED_BY_0019,
               *_ADDED_BY_0020,
               *_ADDED_BY_0021, *_ADDED_BY_0024,
                   *_ADDED_BY_0025, *_ADDED_BY_0026, *_ADDED_AFTER_0026, *_REPLACED_AFTER_0026}
    try:
        call_command("migrate", "soniq_django", "0016", verbosity=0)
        after = _soniq_functions()
        assert after["soniq_enqueue"] == v3
        assert {n: b for n, b in after.items() if n not in changed} == {
            n: b for n, b in before.items() if n not in changed}
        # Replaced, not dropped: the producer keeps its grant; version 3 works again.
        assert _may_enqueue(producer)
        job_id = fetch("SELECT soniq_enqueue('back.to_v3', '{\"n\": 1}')")[0][0]
        assert fetch("SELECT job_name FROM soniq_get_job(%s)", [job_id]) == [("back.to_v3",)]
    finally:
        call_command("migrate", "soniq_django", verbosity=0)
    assert _soniq_functions() == before
    assert _may_enqueue(producer)
    job_id = fetch("SELECT soniq_enqueue('again.v4', '{\"n\": 2}')")[0][0]
    assert fetch("SELECT job_name FROM soniq_get_job(%s)", [job_id]) == [("again.v4",)]
    (ids,) = fetch("SELECT soniq_enqueue_many('[{\"job_name\": \"again.v4_many\", "
                   "\"dedup_key\": \"d-v4\"}]')")[0]
    assert fetch("SELECT job_name FROM soniq_get_job(%s)", [ids[0]]) == [("again.v4_many",)]


@pytest.mark.django_db(transaction=True)
def test_reversing_0018_restores_version_7_and_reapplying_gives_version_8():
    v8 = {name: _file_source("claim_protocol_v8.sql", name)
          for name in (*_REPLACED_BY_0018, *_ADDED_BY_0018)}
    restored = {name: _file_source(released, name)
                for name, released in _REPLACED_BY_0018.items()}
    assert all(v8[name] != restored[name] for name in restored)
    before = _soniq_functions()
    # Version 9's claim since 0019 and version 11's completion since 0023 (tested below),
    # which going back to 0017 reverses.
    later = {*_REPLACED_BY_0019, *_REPLACED_BY_0023, *_ADDED_BY_0024, *_REPLACED_BY_0031}
    assert {name: before[name] for name in v8 if name not in later} == {
        name: body for name, body in v8.items() if name not in later}
    # Version 8 replaced nothing else: version 1's budget and reaper stay as they were.
    assert before["soniq_queue_budget_v1"] == _file_source(
        "claim_protocol_v5.sql", "soniq_queue_budget_v1")
    assert before["soniq_reap_lapsed_v1"] == _file_source(
        "claim_protocol_v3.sql", "soniq_reap_lapsed_v1")
    assert "soniq_jobs_claim_queue_now_idx" in _claim_indexes()
    try:
        call_command("migrate", "soniq_django", "0017", verbosity=0)
        after = _soniq_functions()
        assert {name: after[name] for name in restored} == restored
        assert not set(_ADDED_BY_0018 + _ADDED_BY_0019 + _ADDED_BY_0020
                       + _ADDED_BY_0021 + _ADDED_BY_0025 + _ADDED_BY_0026 + _ADDED_AFTER_0026) & set(after)
        changed = {*_REPLACED_BY_0018, *_ADDED_BY_0018, *_ADDED_BY_0019, *_ADDED_BY_0020,
                   *_ADDED_BY_0021, *_REPLACED_BY_0023, *_ADDED_BY_0024,
                   *_ADDED_BY_0025, *_ADDED_BY_0026, *_ADDED_AFTER_0026, *_REPLACED_AFTER_0026}
        assert {n: b for n, b in after.items() if n not in changed} == {
            n: b for n, b in before.items() if n not in changed}
        assert "soniq_jobs_claim_queue_now_idx" not in _claim_indexes()
        assert fetch("SELECT to_regclass('soniq_queue_holds')") == [(None,)]
        # Version 7 works again, flow control and all: claim two, complete both.
        fetch("SELECT soniq_enqueue('back.to_v7', queue => q) "
              "FROM unnest(ARRAY['paused', 'free', 'free']) AS q")
        fetch("INSERT INTO soniq_queue_settings (queue, paused) VALUES ('paused', true)")
        claimed = fetch("SELECT job_id::text, generation, token, queue FROM "
                        "soniq_claim_many('w', ARRAY['nonce-v7a', 'nonce-v7b', 'nonce-v7c'])")
        assert [row[3] for row in claimed] == ["free", "free"]
        assert fetch("SELECT soniq_complete_many(%s::text[], 'w', %s::bigint[], %s::text[], "
                     "%s::text[], ARRAY[NULL, NULL]::jsonb[])",
                     [list(column) for column in zip(*claimed)]) == [([True, True],)]
    finally:
        fetch("DELETE FROM soniq_queue_settings")
        call_command("migrate", "soniq_django", verbosity=0)
    assert _soniq_functions() == before
    assert "soniq_jobs_claim_queue_now_idx" in _claim_indexes()
    fetch("SELECT soniq_enqueue('again.v8', queue => q) "
          "FROM unnest(ARRAY['paused', 'free', 'free']) AS q")
    fetch("INSERT INTO soniq_queue_settings (queue, paused) VALUES ('paused', true)")
    try:
        claimed = fetch("SELECT job_id::text, generation, token, queue FROM "
                        "soniq_claim_many('w', ARRAY['nonce-v8a', 'nonce-v8b', 'nonce-v8c'])")
        assert [row[3] for row in claimed] == ["free", "free"]
        # Version 8's completion closes the write gate before it returns.
        assert fetch("SELECT soniq_complete_many(%s::text[], 'w', %s::bigint[], %s::text[], "
                     "%s::text[], ARRAY[NULL, NULL]::jsonb[]), "
                     "current_setting('soniq.fenced_write', true)",
                     [list(column) for column in zip(*claimed)]) == [([True, True], "off")]
    finally:
        fetch("DELETE FROM soniq_queue_settings")


@pytest.mark.django_db(transaction=True)
def test_reversing_0019_restores_version_8s_claim_and_reapplying_gives_version_9():
    v9 = {name: _file_source("claim_protocol_v9.sql", name)
          for name in (*_REPLACED_BY_0019, *_ADDED_BY_0019)}
    restored = {name: _file_source(released, name)
                for name, released in _REPLACED_BY_0019.items()}
    assert all(v9[name] != restored[name] for name in restored)
    before = _soniq_functions()
    assert {name: before[name] for name in v9 if name not in _REPLACED_BY_0020} == {
        name: body for name, body in v9.items() if name not in _REPLACED_BY_0020}
    # The reaper version 8 calls stays, untouched.
    assert before["soniq_reap_lapsed_v2"] == _file_source(
        "claim_protocol_v8.sql", "soniq_reap_lapsed_v2")
    try:
        call_command("migrate", "soniq_django", "0018", verbosity=0)
        after = _soniq_functions()
        assert {name: after[name] for name in restored} == restored
        assert not set(_ADDED_BY_0019 + _ADDED_BY_0020
                       + _ADDED_BY_0021 + _ADDED_BY_0025 + _ADDED_BY_0026 + _ADDED_AFTER_0026) & set(after)
        changed = {*_REPLACED_BY_0019, *_ADDED_BY_0019, *_ADDED_BY_0020,
                   *_ADDED_BY_0021, *_REPLACED_BY_0023, *_ADDED_BY_0024,
                   *_ADDED_BY_0025, *_ADDED_BY_0026, *_ADDED_AFTER_0026, *_REPLACED_AFTER_0026}
        assert {n: b for n, b in after.items() if n not in changed} == {
            n: b for n, b in before.items() if n not in changed}
        # Version 8 works again: a lapsed job is settled, a queued one claimed.
        fetch("SELECT soniq_enqueue('back.to_v8') FROM generate_series(1, 2)")
        fetch("SELECT * FROM soniq_claim_many('w', ARRAY['nonce-v8-1'])")
        fetch("SELECT set_config('soniq.fenced_write', 'on', false)")
        fetch("UPDATE soniq_jobs SET lease_expires_at = clock_timestamp() - interval '1 second' "
              "WHERE status = 'processing'")
        fetch("SELECT set_config('soniq.fenced_write', 'off', false)")
        assert len(fetch("SELECT * FROM soniq_claim_many('w', ARRAY['nonce-v8-2'])")) == 1
        # The lapsed job was put back (and the other one claimed).
        assert fetch("SELECT count(*) FROM soniq_jobs WHERE status = 'processing'") == [(1,)]
    finally:
        call_command("migrate", "soniq_django", verbosity=0)
    assert _soniq_functions() == before
    fetch("SELECT soniq_enqueue('again.v9')")
    # The job put back first (in claim order), then the new one.
    assert [row[1] for row in fetch(
        "SELECT job_id, job_name FROM soniq_claim_many('w', ARRAY['nonce-v9', 'nonce-v9b'])")] == [
        "back.to_v8", "again.v9"]


@pytest.mark.django_db(transaction=True)
def test_reversing_0020_drops_the_attempt_history_and_reapplying_gives_it_back():
    v10 = _file_source("claim_protocol_v10.sql", "soniq_claim_many")
    v9 = _file_source("claim_protocol_v9.sql", "soniq_claim_many")
    assert v10 != v9 and v10.replace(",\n                   claimed_at = v_now", "").replace(
        ",\n                       claimed_at = v_now", "") == v9  # one change: the claim time
    added = {name: _file_source("attempts_v1.sql", name) for name in _ADDED_BY_0020}
    before = _soniq_functions()
    assert before["soniq_claim_many"] == _file_source(_LATEST_CLAIM, "soniq_claim_many")
    assert {name: before[name] for name in added} == added
    triggers = ("soniq_attempt_dead", "soniq_attempt_ended", "soniq_attempts_dead_letter_gone",
                "soniq_attempts_job_gone")

    def attempt_triggers():
        return sorted(name for (name,) in fetch(
            "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal AND tgname LIKE 'soniq_att%%'"))

    assert attempt_triggers() == list(triggers)
    try:
        call_command("migrate", "soniq_django", "0019", verbosity=0)
        after = _soniq_functions()
        assert after["soniq_claim_many"] == v9
        assert not set(_ADDED_BY_0020 + _ADDED_BY_0021 + _ADDED_BY_0025
                       + _ADDED_BY_0026 + _ADDED_AFTER_0026) & set(after)
        changed = {*_REPLACED_BY_0020, *_ADDED_BY_0020,
                   *_ADDED_BY_0021, *_REPLACED_BY_0023, *_ADDED_BY_0024,
                   *_ADDED_BY_0025, *_ADDED_BY_0026, *_ADDED_AFTER_0026, *_REPLACED_AFTER_0026}
        assert {n: b for n, b in after.items() if n not in changed} == {
            n: b for n, b in before.items() if n not in changed}
        assert attempt_triggers() == []
        assert fetch("SELECT to_regclass('soniq_job_attempts')") == [(None,)]
        assert fetch("SELECT count(*) FROM information_schema.columns WHERE table_name = "
                     "'soniq_jobs' AND column_name = 'claimed_at'") == [(0,)]
        # Version 9 claims and fails as before, with no history to write.
        fetch("SELECT soniq_enqueue('back.to_v9', max_attempts => 2)")
        [(job_id, generation, token, queue)] = fetch(
            "SELECT job_id::text, generation, token, queue FROM "
            "soniq_claim_many('w', ARRAY['nonce-v9'])")
        assert fetch("SELECT soniq_fail(%s, 'w', %s, %s, %s, 'boom', true)",
                     [job_id, generation, token, queue]) == [(True,)]
    finally:
        call_command("migrate", "soniq_django", verbosity=0)
    assert _soniq_functions() == before and attempt_triggers() == list(triggers)
    # Claimed again under version 10: the claim time is written, the failure recorded.
    fetch("SELECT set_config('soniq.fenced_write', 'on', false)")
    fetch("UPDATE soniq_jobs SET scheduled_at = NULL WHERE job_name = 'back.to_v9'")
    fetch("SELECT set_config('soniq.fenced_write', 'off', false)")
    [(job_id, generation, token, queue)] = fetch(
        "SELECT job_id::text, generation, token, queue FROM "
        "soniq_claim_many('w', ARRAY['nonce-v10'])")
    assert fetch("SELECT claimed_at = updated_at FROM soniq_jobs WHERE id = %s::uuid",
                 [job_id]) == [(True,)]
    assert fetch("SELECT soniq_fail(%s, 'w', %s, %s, %s, 'again', true)",
                 [job_id, generation, token, queue]) == [(True,)]
    assert fetch("SELECT outcome, dead_letter_reason, error FROM soniq_job_attempts "
                 "WHERE job_id = %s::uuid", [job_id]) == [("dead", "max_retries_exceeded",
                                                          "again")]


@pytest.mark.django_db(transaction=True)
def test_reversing_0021_drops_the_trace_contexts_and_reapplying_gives_them_back():
    added = {name: _file_source("job_trace_v1.sql", name) for name in _ADDED_BY_0021}
    before = _soniq_functions()
    assert {name: before[name] for name in added} == added
    triggers = ["soniq_job_trace_dead_letter_gone", "soniq_job_trace_job_gone"]

    def trace_triggers():
        return sorted(name for (name,) in fetch(
            "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal "
            "AND tgname LIKE 'soniq_job_trace%%'"))

    assert trace_triggers() == triggers
    try:
        call_command("migrate", "soniq_django", "0020", verbosity=0)
        after = _soniq_functions()
        assert not set(_ADDED_BY_0021) & set(after)
        changed = {*added, *_REPLACED_BY_0023, *_ADDED_BY_0024,
                   *_ADDED_BY_0025, *_ADDED_BY_0026, *_ADDED_AFTER_0026, *_REPLACED_AFTER_0026}
        assert {n: b for n, b in after.items() if n not in changed} == {
            n: b for n, b in before.items() if n not in changed}
        assert trace_triggers() == []
        assert fetch("SELECT to_regclass('soniq_job_trace')") == [(None,)]
        # Jobs come and go as before, with no trace context to take along.
        [(job_id,)] = fetch("SELECT soniq_enqueue('back.to_0020')::text")
        fetch("DELETE FROM soniq_jobs WHERE id = %s::uuid", [job_id])
    finally:
        call_command("migrate", "soniq_django", verbosity=0)
    assert _soniq_functions() == before and trace_triggers() == triggers


@pytest.mark.django_db(transaction=True)
def test_reversing_0023_restores_version_8s_completion_and_reapplying_gives_version_11():
    v11 = _file_source("claim_protocol_v11.sql", "soniq_complete_many")
    v8 = _file_source("claim_protocol_v8.sql", "soniq_complete_many")
    # One change: the batch of one's fence, written as one IS TRUE (decision 0037).
    assert v11 != v8 and " ".join(v11.replace("(j.claim_token = p_tokens", "j.claim_token = p_tokens").replace(
        "NOT j.cancel_requested) IS TRUE;", "NOT j.cancel_requested;").split()) == " ".join(
        v8.split())
    before = _soniq_functions()
    assert before["soniq_complete_many"] == _file_source(_LATEST_BATCHED, "soniq_complete_many")

    def claim_settings():
        return fetch("SELECT proconfig FROM pg_proc WHERE proname = 'soniq_claim_many' "
                     "AND pronamespace = current_schema()::regnamespace")[0][0]

    assert claim_settings() == ["search_path=pg_catalog, pg_temp", "enable_sort=off", "jit=off"]
    try:
        call_command("migrate", "soniq_django", "0022", verbosity=0)
        after = _soniq_functions()
        assert after["soniq_complete_many"] == v8
        assert claim_settings() == ["search_path=pg_catalog, pg_temp"]
        changed = {*_REPLACED_BY_0023, *_ADDED_BY_0024,
                   *_ADDED_BY_0025, *_ADDED_BY_0026, *_ADDED_AFTER_0026, *_REPLACED_AFTER_0026}
        assert {n: b for n, b in after.items() if n not in changed} == {
            n: b for n, b in before.items() if n not in changed}
        # Version 8's completion works again.
        fetch("SELECT soniq_enqueue('back.to_v10')")
        [(job_id, generation)] = fetch(
            "SELECT job_id::text, generation FROM soniq_claim_many('w', ARRAY['nonce-v10'])")
        assert fetch("SELECT soniq_complete(%s, 'w', %s, 'nonce-v10', 'default')",
                     [job_id, generation]) == [(True,)]
    finally:
        call_command("migrate", "soniq_django", verbosity=0)
    assert _soniq_functions() == before
    assert claim_settings() == ["search_path=pg_catalog, pg_temp", "enable_sort=off", "jit=off"]
    fetch("SELECT soniq_enqueue('again.v11')")
    [(job_id, generation)] = fetch(
        "SELECT job_id::text, generation FROM soniq_claim_many('w', ARRAY['nonce-v11'])")
    assert fetch("SELECT soniq_complete(%s, 'w', %s, 'nonce-v11', 'default')",
                 [job_id, generation]) == [(True,)]
    assert fetch("SELECT soniq_complete(%s, 'w', %s, 'nonce-v11', 'default')",
                 [job_id, generation]) == [(False,)]


@pytest.mark.django_db(transaction=True)
def test_reversing_0025_drops_the_workflows_and_reapplying_gives_them_back():
    added = {name: _file_source(file, name) for file, names in (
        ("workflows_v1.sql", _ADDED_BY_0025[:3]), ("producer_api_v5.sql", _ADDED_BY_0025[3:]),
        ("workflows_v2.sql", _ADDED_BY_0026),  # 0026 depends on 0025: reversed with it
        ("worker_registry_v1.sql", _ADDED_BY_0030))  # and so does 0030
        for name in names}
    added.update(_added_from("0027"))  # and those after 0026
    before = _soniq_functions()
    assert {name: before[name] for name in added} == added

    def workflow_triggers():
        return sorted(name for (name,) in fetch(
            "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal "
            "AND tgname IN ('soniq_dependency_ended', 'soniq_dependency_gone', "
            "'soniq_dependent_guard')"))

    assert len(workflow_triggers()) == 3
    try:
        call_command("migrate", "soniq_django", "0024", verbosity=0)
        after = _soniq_functions()
        assert not set(_ADDED_BY_0025 + _ADDED_BY_0026 + _ADDED_AFTER_0026) & set(after)
        assert workflow_triggers() == []
        assert fetch("SELECT count(*) FROM information_schema.columns WHERE table_name = "
                     "'soniq_jobs' AND column_name = 'has_dependents'") == [(0,)]
        assert after == _reversed_0031({n: b for n, b in before.items() if n not in added})
    finally:
        call_command("migrate", "soniq_django", verbosity=0)
    assert {name: _soniq_functions()[name] for name in added} == added
    assert len(workflow_triggers()) == 3


@pytest.mark.django_db(transaction=True)
def test_reversing_0026_drops_the_purge_triggers_alone_and_reapplying_gives_them_back():
    added = {name: _file_source("workflows_v2.sql", name) for name in _ADDED_BY_0026}
    added.update(_added_from("0027"))  # the migrations after 0026 go with it
    before = _soniq_functions()
    assert {name: before[name] for name in added} == added

    def purge_triggers():
        return sorted(name for (name,) in fetch(
            "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal "
            "AND tgname LIKE 'soniq\\_workflow\\_%%'"))

    assert purge_triggers() == ["soniq_workflow_dead_letter_gone", "soniq_workflow_job_gone"]
    try:
        call_command("migrate", "soniq_django", "0025", verbosity=0)
        after = _soniq_functions()
        assert purge_triggers() == []
        assert after == _reversed_0031(
            {n: b for n, b in before.items() if n not in added})
        assert fetch("SELECT to_regclass('soniq_job_steps')") == [(None,)]
    finally:
        call_command("migrate", "soniq_django", verbosity=0)
    assert {name: _soniq_functions()[name] for name in added} == added
    assert len(purge_triggers()) == 2


@pytest.mark.django_db(transaction=True)
def test_reversing_0028_drops_the_steps_alone_and_reapplying_gives_them_back():
    added = _added_from("0028")  # and those after it
    before = _soniq_functions()
    assert {name: before[name] for name in added} == added

    def step_triggers():
        return sorted(name for (name,) in fetch(
            "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal "
            "AND tgname LIKE 'soniq\\_job\\_steps\\_%%'"))

    assert step_triggers() == ["soniq_job_steps_dead_letter_gone", "soniq_job_steps_job_gone"]
    try:
        call_command("migrate", "soniq_django", "0027", verbosity=0)
        assert step_triggers() == []
        assert _soniq_functions() == _reversed_0031(
            {n: b for n, b in before.items() if n not in added})
        assert fetch("SELECT to_regclass('soniq_job_steps')") == [(None,)]
    finally:
        call_command("migrate", "soniq_django", verbosity=0)
    assert {name: _soniq_functions()[name] for name in added} == added
    assert len(step_triggers()) == 2


@pytest.mark.django_db(transaction=True)
def test_reversing_0027_drops_soniq_enqueue_after_many_alone_and_reapplying_gives_it_back():
    added = _added_from("0027")  # and those after it
    before = _soniq_functions()
    assert {name: before[name] for name in added} == added
    try:
        call_command("migrate", "soniq_django", "0026", verbosity=0)
        assert _soniq_functions() == _reversed_0031(
            {n: b for n, b in before.items() if n not in added})
        # One call per job (producer API v5) still works.
        first = fetch("SELECT soniq_enqueue('back.to_v5')")[0][0]
        fetch("SELECT soniq_enqueue_after(ARRAY[%s]::uuid[], 'back.after')", [first])
    finally:
        call_command("migrate", "soniq_django", verbosity=0)
    assert {name: _soniq_functions()[name] for name in added} == added
    [(ids,)] = fetch("SELECT soniq_enqueue_after_many(%s::jsonb)",
                     ['[{"job_name": "again.v6", "depends_on": []}]'])
    assert fetch("SELECT job_name FROM soniq_get_job(%s)", [ids[0]]) == [("again.v6",)]


@pytest.mark.django_db(transaction=True)
def test_reversing_0030_drops_the_worker_registry_functions_alone_and_reapplying_gives_them_back(
        roles):
    added = _added_from("0030")
    before = _soniq_functions()
    assert {name: before[name] for name in added} == added
    worker = roles.create("soniq_worker")
    call_command("soniq_grant", worker, "--worker", stdout=io.StringIO())
    # The migration 0030 follows (0026 here; whatever the integrator chains it after).
    [(_, target)] = [parent.key for parent in MigrationLoader(connection).graph.node_map[
        ("soniq_django", "0030_worker_registry")].parents]
    try:
        call_command("migrate", "soniq_django", target, verbosity=0)
        assert _soniq_functions() == _reversed_0031(
            {n: b for n, b in before.items() if n not in added})
    finally:
        call_command("migrate", "soniq_django", verbosity=0)
    assert {name: _soniq_functions()[name] for name in added} == added
    # Dropped and created again: the grant went with them (soniq_grant --worker again).
    assert fetch("SELECT has_function_privilege(%s, 'soniq_claim_outcome(text, text, bigint, "
                 "text)', 'EXECUTE')", [worker]) == [(False,)]


def _claim_settings() -> list[str]:
    return fetch("SELECT proconfig FROM pg_proc WHERE proname = 'soniq_claim_many' "
                 "AND pronamespace = current_schema()::regnamespace")[0][0]


def _claim_and_complete_two_keys(prefix: str) -> list[bool]:
    """Two keyed jobs (two keys) claimed in one call and completed in one batch."""
    for key in ("k1", "k2"):
        fetch("SELECT soniq_enqueue_keyed(%s, 1, NULL, %s)", [key, f"{prefix}.{key}"])
    claimed = fetch("SELECT job_id::text, generation, token, queue FROM soniq_claim_many("
                    "'w', ARRAY[%s, %s])", [f"{prefix}-1", f"{prefix}-2"])
    assert len(claimed) == 2
    [(done,)] = fetch("SELECT soniq_complete_many(%s::text[], 'w', %s::bigint[], %s::text[], "
                      "%s::text[], ARRAY[NULL, NULL]::jsonb[])",
                      [list(column) for column in zip(*claimed)])
    return done


@pytest.mark.django_db(transaction=True)
def test_reversing_0031_restores_version_12s_bodies_and_reapplying_gives_version_13(roles):
    v13 = {name: _file_source("claim_protocol_v13.sql", name)
           for name in (*_REPLACED_BY_0031, *_ADDED_BY_0031)}
    restored = {name: _file_source(released, name)
                for name, released in _REPLACED_BY_0031.items()}
    assert all(v13[name] != restored[name] for name in restored)
    before = _soniq_functions()
    # soniq_claim_many: version 14's since 0034 (tested below), which this reverses too.
    assert {name: before[name] for name in v13 if name not in _REPLACED_BY_0034} == {
        name: body for name, body in v13.items() if name not in _REPLACED_BY_0034}
    settings = ["search_path=pg_catalog, pg_temp", "enable_sort=off", "jit=off"]
    assert _claim_settings() == settings
    worker = roles.create("soniq_worker")
    call_command("soniq_grant", worker, "--worker", stdout=io.StringIO())
    # The migration 0031 follows (0030 here; whatever the integrator chains it after).
    [(_, target)] = [parent.key for parent in MigrationLoader(connection).graph.node_map[
        ("soniq_django", "0031_key_lock_order")].parents]
    try:
        call_command("migrate", "soniq_django", target, verbosity=0)
        assert _soniq_functions() == _reversed_0031(
            {n: b for n, b in before.items() if n not in _added_from("0031")})
        assert _claim_settings() == settings  # version 11's, given again after the restore
        assert _claim_and_complete_two_keys("back.to_v12") == [True, True]
    finally:
        call_command("migrate", "soniq_django", verbosity=0)
    assert _soniq_functions() == before and _claim_settings() == settings
    assert _claim_and_complete_two_keys("again.v13") == [True, True]
    # Replaced, not dropped: the worker keeps its grants.
    assert fetch("SELECT has_function_privilege(%s, 'soniq_claim_many(text, text[], text[], "
                 "double precision, double precision, integer)', 'EXECUTE'), "
                 "has_function_privilege(%s, 'soniq_hold_slot(text, text, bigint, text, text, "
                 "double precision)', 'EXECUTE')", [worker, worker]) == [(True, True)]


@pytest.mark.django_db(transaction=True)
def test_reversing_0033_restores_version_12s_admission_and_reapplying_gives_the_exact_one():
    exact = _file_source("key_order_v1.sql", "soniq_key_admit_v1")
    released = _file_source("claim_protocol_v12.sql", "soniq_key_admit_v1")
    assert exact != released
    before = _soniq_functions()
    assert before["soniq_key_admit_v1"] == exact
    # Going back to 0032 reverses 0034 (claim protocol v14, tested below) too.
    after_0034 = {"soniq_claim_many": _file_source("claim_protocol_v13.sql", "soniq_claim_many")}
    try:
        call_command("migrate", "soniq_django", "0032", verbosity=0)
        assert _soniq_functions() == {
            **{n: b for n, b in before.items() if n not in _ADDED_BY_0034}, **after_0034,
            "soniq_key_admit_v1": released}
    finally:
        call_command("migrate", "soniq_django", verbosity=0)
    assert _soniq_functions() == before


@pytest.mark.django_db(transaction=True)
def test_reversing_0034_restores_version_13s_claim_and_reapplying_gives_version_14(roles):
    v14 = {name: _file_source("claim_protocol_v14.sql", name)
           for name in (*_REPLACED_BY_0034, *_ADDED_BY_0034)}
    v13 = _file_source("claim_protocol_v13.sql", "soniq_claim_many")
    # One change to the claim: the next probe from the start 300 s on, not 30 s.
    assert " ".join(v14["soniq_claim_many"].split()) != " ".join(v13.split())
    assert v14["soniq_claim_many"].count("interval '300 seconds'") == 1
    assert v13.count("interval '300 seconds'") == 0
    before = _soniq_functions()
    assert {name: before[name] for name in v14} == v14
    settings = ["search_path=pg_catalog, pg_temp", "enable_sort=off", "jit=off"]
    assert _claim_settings() == settings
    worker = roles.create("soniq_worker")
    call_command("soniq_grant", worker, "--worker", stdout=io.StringIO())
    # The migration 0034 follows (0032 here; whatever the integrator chains it after).
    [(_, target)] = [parent.key for parent in MigrationLoader(connection).graph.node_map[
        ("soniq_django", "0034_claim_protocol_v14")].parents]
    try:
        call_command("migrate", "soniq_django", target, verbosity=0)
        after = _soniq_functions()
        assert "soniq_settle_lapsed" not in after
        assert after == {**{n: b for n, b in before.items() if n not in _ADDED_BY_0034},
                         "soniq_claim_many": v13}
        assert _claim_settings() == settings  # carried by version 13's CREATE
        assert _claim_and_complete_two_keys("back.to_v13") == [True, True]
    finally:
        call_command("migrate", "soniq_django", verbosity=0)
    assert _soniq_functions() == before and _claim_settings() == settings
    assert _claim_and_complete_two_keys("again.v14") == [True, True]
    # The claim was replaced, not dropped: the worker keeps its grant. soniq_settle_lapsed was
    # dropped and created again: granted by soniq_grant --worker once more.
    assert fetch("SELECT has_function_privilege(%s, 'soniq_claim_many(text, text[], text[], "
                 "double precision, double precision, integer)', 'EXECUTE'), "
                 "has_function_privilege(%s, 'soniq_settle_lapsed(double precision)', "
                 "'EXECUTE')", [worker, worker]) == [(True, False)]

"""Migration 0015: soniq_jobs' storage parameters on PostgreSQL, nothing on SQLite.

Storage parameters change how PostgreSQL stores and vacuums the table, not
its format: the admission check passes with them and after they are reset,
and the table's columns, indexes and constraints stay what they were.
"""

import importlib

from django.db import connection

from soniq_django.schema.admission import check_owned_schema
from tests.support.schema import fetchall, migrate, schema_snapshot

tuning = importlib.import_module("soniq_django.migrations.0015_storage_tuning")
BEFORE = "0014"  # the migration 0015 follows
#: Tables and indexes later migrations create (0018): absent at BEFORE, not 0015's business.
LATER_OBJECTS = {"soniq_queue_holds", "soniq_jobs_claim_queue_now_idx",
                 # 0020_attempts: the table, its index and triggers, and claimed_at.
                 "soniq_job_attempts", "soniq_job_attempts_job_idx", "soniq_attempt_ended",
                 "soniq_attempt_given_back", "soniq_attempt_dead", "soniq_attempts_job_gone",
                 "soniq_attempts_dead_letter_gone", "claimed_at",
                 # 0021_job_trace: the table and the triggers that purge it.
                 "soniq_job_trace", "soniq_job_trace_job_gone",
                 "soniq_job_trace_dead_letter_gone",
                 # 0022_jobs_created_idx: the admin's newest-first index.
                 "soniq_jobs_created_idx",
                 # 0024_job_progress: the progress and waiters' tables, their triggers.
                 "soniq_job_progress", "soniq_job_waiters", "soniq_job_waiters_pkey",
                 "soniq_job_finished", "soniq_job_dead_lettered",
                 "soniq_job_progress_job_gone", "soniq_job_progress_dead_letter_gone",
                 # 0025_workflows: its tables, their indexes, the triggers, has_dependents.
                 "soniq_job_dependencies", "soniq_job_waits", "soniq_batches",
                 "soniq_batch_members", "soniq_workflow_settle",
                 "soniq_job_dependencies_on_idx", "soniq_job_dependencies_pair",
                 "soniq_batch_members_pos", "soniq_batch_members_job_idx",
                 "soniq_dependency_ended", "soniq_dependency_gone", "soniq_dependent_guard",
                 "has_dependents",
                 # 0026_workflow_purge: the triggers that take workflow rows with a job.
                 "soniq_workflow_job_gone", "soniq_workflow_dead_letter_gone",
                 # 0028_job_steps: the steps' table, its key and the triggers that purge it.
                 "soniq_job_steps", "soniq_job_steps_pkey", "soniq_job_steps_job_gone",
                 "soniq_job_steps_dead_letter_gone",
                 # 0029_keys: the key tables, their indexes and constraints, the triggers,
                 # concurrency_key.
                 "soniq_key_slots", "soniq_key_limits", "soniq_key_parked", "soniq_key_starts",
                 "soniq_key_holds", "soniq_key_slots_key", "soniq_key_slots_concurrency_valid",
                 "soniq_key_slots_rate_valid", "soniq_key_limits_pattern",
                 "soniq_key_limits_concurrency_valid", "soniq_key_limits_rate_valid",
                 "soniq_key_parked_order_idx", "soniq_key_parked_due_idx",
                 "soniq_key_parked_now_idx",
                 # 0033_key_admit_exact: the index of a key's order (it drops two above).
                 "soniq_key_parked_rank_idx",
                 "soniq_key_starts_idx", "soniq_key_holds_claim",
                 "soniq_key_moved", "soniq_key_gone", "soniq_key_deferred",
                 "soniq_key_hold_gone", "soniq_key_admit", "concurrency_key",
                 # 0032_key_park: the triggers of a dead letter's key and a released
                 # dependent's parking (and the dead letters' concurrency_key, below).
                 "soniq_key_dead_letter", "soniq_key_released"}
#: The columns 0020, 0025 and 0029 add to soniq_jobs, and 0032 to soniq_dead_letter_jobs,
#: as SQLite's table definitions end with them.
_LATER_SQLITE_COLUMNS = (', "claimed_at" datetime NULL', ', "has_dependents" bool NULL',
                         ', "concurrency_key" text NULL')


def without_later_tables(shape: list) -> list:
    """``shape`` (schema_snapshot's) less the objects of later migrations, and their tables'."""
    return [tuple(_without_later_columns(part) if isinstance(part, str) else part
                  for part in entry)
            for entry in shape if not LATER_OBJECTS & {entry[1], entry[2]}]


def _without_later_columns(text: str) -> str:
    for column in _LATER_SQLITE_COLUMNS:
        text = text.replace(column, "")
    return text


def reloptions() -> list[str] | None:
    if connection.vendor != "postgresql":
        return None
    [(options,)] = fetchall("SELECT reloptions FROM pg_class WHERE oid = 'soniq_jobs'::regclass")
    return sorted(options or [])


def expected() -> list[str]:
    return sorted(f"{key}={value}" for key, value in tuning.PARAMETERS.items())


def test_the_latest_schema_has_the_tuned_storage_and_passes_the_check(at_latest_afterwards):
    if connection.vendor == "postgresql":
        assert reloptions() == expected()
    else:
        assert reloptions() is None
    assert check_owned_schema(connection) == []


def test_reversing_resets_the_parameters_and_changes_nothing_else(at_latest_afterwards):
    latest_shape, latest_applied = schema_snapshot()
    migrate(BEFORE)
    shape, applied = schema_snapshot()
    assert "0015_storage_tuning" not in applied and "0015_storage_tuning" in latest_applied
    assert reloptions() in ([], None)
    assert check_owned_schema(connection) == []
    migrate()
    assert reloptions() == (expected() if connection.vendor == "postgresql" else None)
    assert schema_snapshot() == (latest_shape, latest_applied)
    # Columns, indexes, constraints: the same without the tuning.
    assert shape == without_later_tables(latest_shape)


def test_the_parameters_are_reset_on_the_way_down_even_if_changed_by_hand(at_latest_afterwards):
    # An operator may have changed one of them since: the reverse resets what 0015 set,
    # whatever its value now, and leaves a parameter 0015 never set alone.
    key = "autovacuum_vacuum_scale_factor"
    assert key in tuning.PARAMETERS
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE soniq_jobs SET ({key} = 0.3, toast_tuple_target = 4096)")
    migrate(BEFORE)
    if connection.vendor == "postgresql":
        assert reloptions() == ["toast_tuple_target=4096"]
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE soniq_jobs RESET (toast_tuple_target)")
    migrate()
    assert reloptions() == (expected() if connection.vendor == "postgresql" else None)
    assert check_owned_schema(connection) == []

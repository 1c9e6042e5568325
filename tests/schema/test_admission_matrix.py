"""The admission rules' matrix: each hostile pre-existing schema is refused, and nothing changes.

One migration path, one catalog per case: the cases share one trip to 0002
and back (a module fixture), and each case's own changes are removed after
it (``clean_format1``); each starts by checking that the schema is 0002's,
exactly, so a case cannot lean on what another left. The other admission
tests (test_admission.py) take the same path on Django 6.0 too; the matrix
runs in the Django 5.2 passes only.
"""

import pytest
from django.conf import settings
from django.db import connection

from soniq_django.schema.admission import SchemaAdmissionError
from tests.support.schema import (
    applied_soniq_migrations, assert_refused, clean_format1, execute, insert_format1_job, migrate,
    restore_latest, rows_snapshot, schema_snapshot,
)

PG = settings.BACKEND == "postgresql"

pytestmark = pytest.mark.version_independent

ADD = "ALTER TABLE soniq_jobs ADD COLUMN "
ADD_DLQ = "ALTER TABLE soniq_dead_letter_jobs ADD COLUMN "
TOKEN = ADD + "claim_token varchar(255) NULL"

# id: (statements on PostgreSQL, statements on SQLite, table, column or index, rule).
# None: the case does not exist on that database.
HOSTILE = {
    "char-token": ([ADD + "claim_token char(255) NULL"], [ADD + "claim_token character(255) NULL"],
                   "soniq_jobs", "claim_token", "varchar-required"),
    "text-submission": ([ADD + "submission_id text NULL"], [ADD + "submission_id text NULL"],
                        "soniq_jobs", "submission_id", "varchar-required"),
    "dlq-bpchar-fingerprint": (
        [ADD_DLQ + "submission_fingerprint bpchar NULL"],
        [ADD_DLQ + "submission_fingerprint nchar(255) NULL"],
        "soniq_dead_letter_jobs", "submission_fingerprint", "varchar-required"),
    "short-varchar": ([ADD + "claim_owner varchar(64) NULL"], [ADD + "claim_owner varchar(64)"],
                      "soniq_jobs", "claim_owner", "varchar-length"),
    "uuid-default": ([ADD + "claim_token varchar(255) DEFAULT gen_random_uuid()::text"],
                     [ADD + "claim_token varchar(255) DEFAULT 'legacy'"],
                     "soniq_jobs", "claim_token", "identity-default"),
    "constant-default": ([ADD + "submission_id varchar(255) DEFAULT 'x'"],
                         [ADD + "submission_id varchar(255) DEFAULT 'x'"],
                         "soniq_jobs", "submission_id", "identity-default"),
    "empty-default": ([ADD_DLQ + "submission_fingerprint varchar(255) DEFAULT ''"],
                      [ADD_DLQ + "submission_fingerprint varchar(255) DEFAULT ''"],
                      "soniq_dead_letter_jobs", "submission_fingerprint", "identity-default"),
    "generation-one": ([ADD + "claim_generation bigint NOT NULL DEFAULT 1"],
                       [ADD + "claim_generation bigint NOT NULL DEFAULT 1"],
                       "soniq_jobs", "claim_generation", "generation-default"),
    "generation-quoted-one": ([ADD + "claim_generation bigint NOT NULL DEFAULT '1'"],
                              [ADD + "claim_generation bigint NOT NULL DEFAULT '1'"],
                              "soniq_jobs", "claim_generation", "generation-default"),
    "generation-nullable": ([ADD + "claim_generation bigint NULL DEFAULT 0"],
                            [ADD + "claim_generation bigint NULL DEFAULT 0"],
                            "soniq_jobs", "claim_generation", "nullability"),
    "generation-type": ([ADD + "claim_generation integer NOT NULL DEFAULT 0"],
                        [ADD + "claim_generation text NOT NULL DEFAULT '0'"],
                        "soniq_jobs", "claim_generation", "column-type"),
    "generation-identity": ([ADD + "claim_generation bigint GENERATED ALWAYS AS IDENTITY"], None,
                            "soniq_jobs", "claim_generation", "generated-column"),
    "boolean-true": ([ADD + "fence_required boolean NOT NULL DEFAULT true"],
                     [ADD + "fence_required bool NOT NULL DEFAULT 1"],
                     "soniq_jobs", "fence_required", "boolean-default"),
    "sqlite-quoted-false": (None, [ADD + "fence_required bool NOT NULL DEFAULT 'false'"],
                            "soniq_jobs", "fence_required", "boolean-default"),
    "boolean-nullable": ([ADD + "cancel_requested boolean NULL"],
                         [ADD + "cancel_requested bool NULL"],
                         "soniq_jobs", "cancel_requested", "nullability"),
    "dlq-boolean-true": ([ADD_DLQ + "fence_required boolean NOT NULL DEFAULT 'true'::boolean"],
                         [ADD_DLQ + "fence_required bool NOT NULL DEFAULT '1'"],
                         "soniq_dead_letter_jobs", "fence_required", "boolean-default"),
    "lease-default": ([ADD + "lease_expires_at timestamptz DEFAULT now()"],
                      [ADD + "lease_expires_at datetime DEFAULT '2030-01-01 00:00:00'"],
                      "soniq_jobs", "lease_expires_at", "column-default"),
    "lease-without-zone": ([ADD + "lease_expires_at timestamp NULL"], None,
                           "soniq_jobs", "lease_expires_at", "column-type"),
    "token-not-null": ([ADD + "claim_token varchar(255) NOT NULL DEFAULT ''"],
                       [ADD + "claim_token varchar(255) NOT NULL DEFAULT ''"],
                       "soniq_jobs", "claim_token", "nullability"),
    "sqlite-nocase": (None, [ADD + "claim_token varchar(255) COLLATE NOCASE"],
                      "soniq_jobs", "claim_token", "collation-binary"),
    "sqlite-rtrim": (None, [ADD_DLQ + "submission_id VARCHAR(255) NULL collate rtrim"],
                     "soniq_dead_letter_jobs", "submission_id", "collation-binary"),
    "partial-index": (
        [TOKEN, "CREATE UNIQUE INDEX hostile_idx ON soniq_jobs (claim_token) "
                "WHERE claim_token IS NOT NULL"],
        [TOKEN, "CREATE UNIQUE INDEX hostile_idx ON soniq_jobs (claim_token) "
                "WHERE claim_token IS NOT NULL"],
        "soniq_jobs", "hostile_idx", "index-partial"),
    "expression-index": (
        [TOKEN, "CREATE UNIQUE INDEX hostile_idx ON soniq_jobs (lower(claim_token))"],
        [TOKEN, "CREATE UNIQUE INDEX hostile_idx ON soniq_jobs (lower(claim_token))"],
        "soniq_jobs", "hostile_idx", "index-expression"),
    "multi-column-index": (
        [TOKEN, "CREATE UNIQUE INDEX hostile_idx ON soniq_jobs (claim_token, queue)"],
        [TOKEN, "CREATE UNIQUE INDEX hostile_idx ON soniq_jobs (queue, claim_token)"],
        "soniq_jobs", "hostile_idx", "index-multi-column"),
    "covering-index": (
        [TOKEN, "CREATE UNIQUE INDEX hostile_idx ON soniq_jobs (claim_token) INCLUDE (queue)"],
        None, "soniq_jobs", "hostile_idx", "index-multi-column"),
    "collated-index": (
        [TOKEN, 'CREATE UNIQUE INDEX hostile_idx ON soniq_jobs (claim_token COLLATE "C")'],
        [TOKEN, "CREATE UNIQUE INDEX hostile_idx ON soniq_jobs (claim_token COLLATE NOCASE)"],
        "soniq_jobs", "hostile_idx", "index-collation"),
    "opclass-index": (
        [TOKEN, "CREATE UNIQUE INDEX hostile_idx ON soniq_jobs (claim_token varchar_pattern_ops)"],
        None, "soniq_jobs", "hostile_idx", "index-opclass"),
    "nulls-not-distinct": (
        [TOKEN, "CREATE UNIQUE INDEX hostile_idx ON soniq_jobs (claim_token) NULLS NOT DISTINCT"],
        None, "soniq_jobs", "hostile_idx", "index-nulls-not-distinct"),
    "deferrable-unique": (
        [TOKEN, "ALTER TABLE soniq_jobs ADD CONSTRAINT hostile_idx UNIQUE (claim_token) "
                "DEFERRABLE INITIALLY DEFERRED"],
        None, "soniq_jobs", "hostile_idx", "index-deferrable"),
    "plain-index": ([TOKEN, "CREATE INDEX hostile_idx ON soniq_jobs (claim_token)"],
                    [TOKEN, "CREATE INDEX hostile_idx ON soniq_jobs (claim_token)"],
                    "soniq_jobs", "hostile_idx", "index-not-unique"),
    "dlq-partial-index": (
        [ADD_DLQ + "submission_id varchar(255) NULL",
         "CREATE UNIQUE INDEX hostile_idx ON soniq_dead_letter_jobs (submission_id) "
         "WHERE resurrection_count = 0"],
        [ADD_DLQ + "submission_id varchar(255) NULL",
         "CREATE UNIQUE INDEX hostile_idx ON soniq_dead_letter_jobs (submission_id) "
         "WHERE resurrection_count = 0"],
        "soniq_dead_letter_jobs", "hostile_idx", "index-partial"),
    "helper-name-taken": (["CREATE INDEX soniq_jobs_lease_idx ON soniq_jobs (status)"],
                          ["CREATE INDEX soniq_jobs_lease_idx ON soniq_jobs (status)"],
                          "soniq_jobs", "soniq_jobs_lease_idx", "name-taken"),
    "identity-name-taken": (["CREATE INDEX soniq_jobs_claim_token_key ON soniq_jobs (queue)"],
                            ["CREATE INDEX soniq_jobs_claim_token_key ON soniq_jobs (queue)"],
                            "soniq_jobs", "soniq_jobs_claim_token_key", "name-taken"),
    "check-name-taken": (
        ["ALTER TABLE soniq_jobs ADD CONSTRAINT soniq_jobs_generation_not_negative "
         "CHECK (attempts >= 0)"],
        None, "soniq_jobs", "soniq_jobs_generation_not_negative", "name-taken"),
}


def _cases():
    for case_id, (pg, sqlite, *_rest) in HOSTILE.items():
        if (pg if PG else sqlite) is not None:
            yield case_id


@pytest.fixture(scope="module")
def format1(django_db_setup, django_db_blocker):
    """The database at 0002 for the whole matrix; its schema then (the baseline)."""
    with django_db_blocker.unblock():
        migrate("0002")
        yield schema_snapshot()
        connection.close()
        restore_latest()


@pytest.fixture
def at_clean_format1(format1, transactional_db):
    assert schema_snapshot() == format1, "the last case left a change behind"
    yield
    connection.close()  # drop any per-connection state the case installed
    clean_format1()


@pytest.mark.parametrize("case_id", list(_cases()))
def test_hostile_pre_existing_schema_is_refused_and_nothing_changes(at_clean_format1, case_id):
    pg, sqlite, table, name, rule = HOSTILE[case_id]
    insert_format1_job(status="done")
    for statement in pg if PG else sqlite:
        execute(statement)
    before, rows = schema_snapshot(), rows_snapshot()

    with pytest.raises(SchemaAdmissionError) as refused:
        migrate()

    assert_refused(refused.value, table, name, rule)
    assert schema_snapshot() == before  # no column, index or migration record changed
    assert rows_snapshot() == rows
    assert "0003_owned_queue" not in applied_soniq_migrations()

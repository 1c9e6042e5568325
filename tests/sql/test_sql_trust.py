"""The SQL API's trust model, with real PostgreSQL roles.

Roles are cluster-wide: each test creates uniquely named LOGIN roles and
drops them (with everything they own or were granted in the test database)
afterwards. Roles connect with psycopg to the same test database.
"""

import io
import json
import uuid

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection

from soniq_django import args_hash
from soniq_django.models import DeadLetterJob, Job

from tests.support.sql import (
    PUBLIC_FUNCTIONS,
    Roles,
    fetch,
    producer_api_functions,
    quote_ident,
    raw,
    raw_fails,
    schema,
    unique_name,
)

pytestmark = [pytest.mark.postgresql_only, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def roles():
    made = Roles()
    yield made
    made.drop_all()


def grant(role):
    out = io.StringIO()
    call_command("soniq_grant", role, stdout=out)
    return out.getvalue()


def assert_refused(conn, sql, sqlstate, hint=None, params=()):
    error = raw_fails(conn, sql, params)
    assert (error.sqlstate, error.diag.message_hint) == (sqlstate, hint), str(error)
    return error


# --------------------------------------------------------------------------
# How the functions are declared


@pytest.mark.django_db
def test_functions_run_as_definer_with_a_fixed_search_path_and_no_public_execute():
    names = producer_api_functions()
    assert set(PUBLIC_FUNCTIONS) <= set(names) and len(names) >= 7
    rows = fetch(
        "SELECT p.proname, p.prosecdef, p.proconfig, p.proowner::regrole::text, "
        "       p.proacl IS NOT NULL, has_function_privilege('public', p.oid, 'EXECUTE'), "
        "       (SELECT count(*) FROM aclexplode(p.proacl) AS a WHERE a.grantee = 0) "
        "  FROM pg_proc AS p "
        " WHERE p.pronamespace = current_schema()::regnamespace AND p.proname = ANY(%s)",
        [names],
    )
    assert sorted(row[0] for row in rows) == sorted(names)  # one function per name
    owner = fetch("SELECT current_user")[0][0]
    for name, secdef, config, proowner, has_acl, public_exec, public_entries in rows:
        assert secdef is (name in PUBLIC_FUNCTIONS), name
        assert config == ["search_path=pg_catalog, pg_temp"], name
        assert proowner == owner, name
        # A NULL ACL would mean the default: EXECUTE for PUBLIC.
        assert has_acl and not public_exec and public_entries == 0, name


@pytest.mark.django_db
def test_the_tables_are_not_open_to_public():
    for table in ("soniq_jobs", "soniq_dead_letter_jobs", "soniq_recurring_jobs", "soniq_workers",
                  "soniq_task_registry", "soniq_queue_holds"):
        for privilege in ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE"):
            assert fetch("SELECT has_table_privilege('public', %s, %s)", [table, privilege]) == [
                (False,)]


# --------------------------------------------------------------------------
# Granted and ungranted roles


def test_a_granted_producer_can_enqueue_and_read_but_not_touch_the_tables(roles):
    role = roles.create("soniq_producer")
    output = grant(role)
    assert output.count("GRANT") == 10
    with roles.connect(role, application_name="") as conn:
        job_id = conn.execute(
            "SELECT soniq_enqueue('trust.job', '{\"n\": 1}', unique_job => true)").fetchone()[0]
        assert conn.execute(
            "SELECT soniq_enqueue('trust.job', '{\"n\": 1}', unique_job => true)"
        ).fetchone()[0] == job_id
        row = conn.execute(
            "SELECT id, job_name, status FROM soniq_get_job(%s)", [job_id]).fetchone()
        assert row == (job_id, "trust.job", "queued")
        assert conn.execute("SELECT soniq_args_hash('{\"n\": 1}')").fetchone()[0] == args_hash(
            {"n": 1})
        batch = conn.execute(
            "SELECT soniq_enqueue_many('[{\"job_name\": \"trust.job\", \"args\": {\"n\": 1}, "
            "\"unique_job\": true}, {\"job_name\": \"trust.many\"}]')").fetchone()[0]
        assert batch[0] == job_id
        # A job limited per key (claim_protocol_v12.sql), through its own definer function.
        keyed = conn.execute("SELECT soniq_enqueue_keyed('tenant-1', 1, '5/s', 'trust.keyed')"
                             ).fetchone()[0]
        assert conn.execute("SELECT status FROM soniq_get_job(%s)", [keyed]).fetchone() == (
            "queued",)
        assert_refused(conn, "SELECT soniq_enqueue_many('[{\"job_name\": \"Bad Name\"}]')",
                       "22023", "SONIQ_INVALID_TASK_NAME")
        assert_refused(conn, "SELECT soniq_enqueue('Bad Name', '{}')", "22023",
                       "SONIQ_INVALID_TASK_NAME")

        refused = [
            "SELECT * FROM soniq_jobs",
            "SELECT count(*) FROM soniq_jobs",
            "INSERT INTO soniq_jobs (id, job_name, args, status, queue, max_attempts) "
            "VALUES (gen_random_uuid(), 'x.y', '{}', 'queued', 'default', 4)",
            "UPDATE soniq_jobs SET status = 'done'",
            "DELETE FROM soniq_jobs",
            "TRUNCATE soniq_jobs",
            "SELECT * FROM soniq_dead_letter_jobs",
            "DELETE FROM soniq_dead_letter_jobs",
            "SELECT * FROM soniq_recurring_jobs",
            "SELECT * FROM soniq_workers",
            "SELECT * FROM soniq_task_registry",
            "SELECT * FROM soniq_key_slots",
            "SELECT soniq_key_sweep()",
            "SELECT soniq_settle_lapsed(300)",
            "SELECT soniq_key_refresh('default', '*')",
            # The internal helpers are not granted.
            "SELECT soniq_canonical_json_v1('{}')",
            "SELECT soniq_check_args_v1('{}')",
            "SELECT soniq_json_string_v1('x')",
            "SELECT soniq_task_name_pattern_v1()",
        ]
        for sql in refused:
            assert_refused(conn, sql, "42501")
    job = Job.objects.get(id=job_id)
    assert (job.status, job.producer_id) == ("queued", role)  # session_user, not the owner
    assert Job.objects.get(id=batch[1]).producer_id == role
    assert Job.objects.get(id=keyed).producer_id == role
    assert Job.objects.count() == 3


def test_the_grant_covers_exactly_the_producer_functions(roles):
    role = roles.create("soniq_producer")
    grant(role)
    rows = fetch(
        "SELECT p.proname, has_function_privilege(%s, p.oid, 'EXECUTE') FROM pg_proc AS p "
        "WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'soniq\\_%%'",
        [role],
    )
    executable = sorted(name for name, allowed in rows if allowed)
    assert executable == sorted(PUBLIC_FUNCTIONS)
    assert len(rows) >= 7


def test_a_role_without_the_grant_can_call_nothing(roles):
    role = roles.create("soniq_stranger")
    with roles.connect(role) as conn:
        for sql, name in [
            ("SELECT soniq_enqueue('trust.job', '{}')", "soniq_enqueue"),
            ("SELECT * FROM soniq_get_job(gen_random_uuid())", "soniq_get_job"),
            ("SELECT soniq_args_hash('{}')", "soniq_args_hash"),
            ("SELECT soniq_enqueue_many('[]')", "soniq_enqueue_many"),
            ("SELECT soniq_enqueue_after('{}'::uuid[], 'trust.job')", "soniq_enqueue_after"),
            ("SELECT soniq_enqueue_after_many('[]')", "soniq_enqueue_after_many"),
            # Migration 0024's progress: a worker's (under its fence), never a producer's.
            ("SELECT soniq_set_progress(gen_random_uuid()::text, 'w', 1, 't', 'q', 1)",
             "soniq_set_progress"),
            # Migration 0028's durable steps: a worker's (under its fence), never a producer's.
            ("SELECT * FROM soniq_get_step(gen_random_uuid()::text, 'w', 1, 't', 'q', 's')",
             "soniq_get_step"),
            ("SELECT soniq_record_step(gen_random_uuid()::text, 'w', 1, 't', 'q', 's', 'null')",
             "soniq_record_step"),
            # Claim protocol v8's holds: a worker's, never a producer's or a stranger's.
            ("SELECT soniq_hold_slot(gen_random_uuid()::text, 'w', 1, 't', 'q')",
             "soniq_hold_slot"),
            ("SELECT soniq_release_hold(gen_random_uuid()::text, 'w', 1)", "soniq_release_hold"),
            ("SELECT soniq_renew_holds('w', ARRAY['x'], ARRAY[1]::bigint[])",
             "soniq_renew_holds"),
        ]:
            error = assert_refused(conn, sql, "42501")
            assert error.diag.message_primary == f"permission denied for function {name}"
        assert_refused(conn, "SELECT * FROM soniq_jobs", "42501")
    assert Job.objects.count() == 0


def test_a_granted_producer_can_enqueue_with_dependencies_from_sql(roles):
    role = roles.create("soniq_producer")
    grant(role)
    with roles.connect(role, application_name="") as conn:
        first = conn.execute("SELECT soniq_enqueue('trust.first', '{}')").fetchone()[0]
        second = conn.execute(
            "SELECT soniq_enqueue_after(ARRAY[%s]::uuid[], 'trust.second', '{\"n\": 2}')",
            [first]).fetchone()[0]
        row = conn.execute("SELECT status, scheduled_at FROM soniq_get_job(%s)",
                           [second]).fetchone()
        assert row[0] == "queued" and row[1].year == 9999  # waits for its dependency
        assert_refused(conn, "SELECT soniq_enqueue_after(ARRAY[gen_random_uuid()], 'trust.x')",
                       "22023", "SONIQ_UNKNOWN_DEPENDENCY")
        third = conn.execute(
            "SELECT soniq_enqueue_after_many(%s::jsonb)",
            [f'[{{"job_name": "trust.third", "depends_on": ["{first}"]}}]']).fetchone()[0][0]
        # Still nothing on the tables themselves.
        for sql in ("SELECT * FROM soniq_job_dependencies", "SELECT * FROM soniq_job_waits",
                    "DELETE FROM soniq_job_waits", "SELECT * FROM soniq_batches"):
            assert_refused(conn, sql, "42501")
    edge = fetch("SELECT depends_on, state FROM soniq_job_dependencies WHERE job_id = %s",
                 [second])
    assert edge == [(first, "waiting")]
    assert Job.objects.get(id=second).producer_id == role
    assert Job.objects.get(id=third).producer_id == role
    assert Job.objects.get(id=third).scheduled_at.year == 9999
    assert Job.objects.count() == 3


def test_producer_id_is_the_application_name_a_client_chose(roles):
    role = roles.create("soniq_producer")
    grant(role)
    with roles.connect(role, application_name="billing-service") as conn:
        job_id = conn.execute("SELECT soniq_enqueue('trust.job', '{}')").fetchone()[0]
    assert Job.objects.get(id=job_id).producer_id == "billing-service"


# --------------------------------------------------------------------------
# Planted functions and operators

# (name, argument types, return type): same-named as built-ins the functions use.
PLANTED_FUNCTIONS = [
    ("jsonb_typeof", "jsonb", "text"),
    ("length", "text", "integer"),
    ("gen_random_uuid", "", "uuid"),
    ("starts_with", "text, text", "boolean"),
    ("substr", "text, integer", "text"),
    ("current_setting", "text", "text"),
    ("current_database", "", "name"),
    ("now", "", "timestamptz"),
    ("pg_notify", "text, text", "void"),
    ("sha256", "bytea", "bytea"),
    ("encode", "bytea, text", "text"),
    ("convert_to", "text, name", "bytea"),
    ("jsonb_path_exists", "jsonb, jsonpath", "boolean"),
    ("jsonb_path_exists", "jsonb, jsonpath, jsonb", "boolean"),
    ("ascii", "text", "integer"),
    ("lpad", "text, integer, text", "text"),
    ("to_hex", "integer", "text"),
    ("to_hex", "bigint", "text"),
    ("jsonb_each", "jsonb", "TABLE(key text, value jsonb)"),
    ("jsonb_array_elements", "jsonb", "SETOF jsonb"),
    ("regexp_split_to_table", "text, text", "SETOF text"),
    ("unnest", "text[]", "SETOF text"),
    ("unnest", "anyarray", "SETOF anyelement"),
    ("octet_length", "text", "integer"),
    ("format", "text, bigint", "text"),
    ("format", "text", "text"),
]

# (operator, left type, right type, return type)
PLANTED_OPERATORS = [
    ("=", "text", "text", "boolean"),
    ("<>", "text", "text", "boolean"),
    ("~", "text", "text", "boolean"),
    ("!~", "text", "text", "boolean"),
    ("||", "text", "text", "text"),
    ("||", "text[]", "text", "text[]"),
    ("=", "uuid", "uuid", "boolean"),
    ("=", "integer", "integer", "boolean"),
    ("=", "bigint", "integer", "boolean"),
    ("<", "integer", "integer", "boolean"),
    (">", "integer", "integer", "boolean"),
    ("<=", "integer", "integer", "boolean"),
    ("<=", "timestamptz", "timestamptz", "boolean"),
    (">", "timestamptz", "timestamptz", "boolean"),
    ("#>>", "jsonb", "text[]", "text"),
    ("-", "integer", "integer", "integer"),
    ("+", "integer", "integer", "integer"),
    (">=", "integer", "integer", "boolean"),
    ("->", "jsonb", "text", "jsonb"),
    ("->>", "jsonb", "text", "text"),
    ("-", "jsonb", "text[]", "jsonb"),
    ("=", "jsonb", "jsonb", "boolean"),
    ("?", "jsonb", "text", "boolean"),
]

PLANTED = "soniq-planted-object-ran"


def _plant(conn, target_schema):
    s = quote_ident(target_schema)
    body = f"BEGIN RAISE EXCEPTION '{PLANTED}: %', current_user; END"
    for name, args, returns in PLANTED_FUNCTIONS:
        conn.execute(
            f"CREATE FUNCTION {s}.{quote_ident(name)}({args}) RETURNS {returns} "
            f"LANGUAGE plpgsql AS $$ {body} $$"
        )
    conn.execute(
        f"CREATE FUNCTION {s}.planted_agg_step(text, text, text) RETURNS text "
        f"LANGUAGE plpgsql AS $$ {body} $$"
    )
    conn.execute(f"CREATE AGGREGATE {s}.string_agg(text, text) "
                 f"(SFUNC = {s}.planted_agg_step, STYPE = text)")
    for n, (op, left, right, returns) in enumerate(PLANTED_OPERATORS):
        fn = f"{s}.planted_op_{n}"
        conn.execute(
            f"CREATE FUNCTION {fn}({left}, {right}) RETURNS {returns} "
            f"LANGUAGE plpgsql AS $$ {body} $$"
        )
        conn.execute(
            f"CREATE OPERATOR {s}.{op} (LEFTARG = {left}, RIGHTARG = {right}, FUNCTION = {fn})"
        )


def test_planted_functions_and_operators_are_never_called(roles):
    soniq_schema = schema()
    attacker = roles.create("soniq_attacker")
    own_schema = unique_name("soniq_attacker_schema")
    grant(attacker)
    with raw() as admin:
        # What PostgreSQL 14 and older allow every role by default.
        who = quote_ident(attacker)
        admin.execute(f"GRANT CREATE ON SCHEMA {quote_ident(soniq_schema)} TO {who}")
        admin.execute(f"CREATE SCHEMA {quote_ident(own_schema)} AUTHORIZATION {who}")

    notices = []
    with roles.connect(attacker, application_name="") as conn:
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary))
        _plant(conn, soniq_schema)
        _plant(conn, own_schema)
        for table in ("soniq_jobs", "soniq_dead_letter_jobs"):
            conn.execute(f"CREATE TABLE {quote_ident(own_schema)}.{table} (id uuid, job_name text)")
        conn.execute("CREATE TEMP TABLE soniq_jobs (id uuid, job_name text)")
        conn.execute(
            f"SET search_path = {quote_ident(own_schema)}, {quote_ident(soniq_schema)}, pg_catalog"
        )

        # The plants are live: unqualified calls in this session reach them.
        for sql in ["SELECT length('abc'::text)", "SELECT 'a'::text = 'a'::text",
                    "SELECT gen_random_uuid()", "SELECT jsonb_typeof('{}'::jsonb)",
                    "SELECT 'a'::text ~ 'a'::text", "SELECT 'a'::text || 'b'::text",
                    "SELECT count(*) FROM soniq_jobs"]:
            if "count" in sql:
                assert conn.execute(sql).fetchone()[0] == 0  # the decoy table
                continue
            error = raw_fails(conn, sql)
            assert error.sqlstate == "P0001" and PLANTED in error.diag.message_primary, sql

        # soniq's functions do not: every path of enqueue, args_hash and get_job runs.
        args = {"to": "zoë@example.com", "q": 'say "hi"\\\n\t\x7f', "astral": "😀🧪",
                "list": [1, 1e16, -0.0, 1.5e-7, None, True, {"b": 1, "a": [2]}]}
        text = json.dumps(args)
        plain = conn.execute(
            "SELECT soniq_enqueue('trust.plain', %s::jsonb, run_at => "
            "'2020-01-01T00:00:00Z'::timestamptz)", [text]).fetchone()[0]
        unique = conn.execute(
            "SELECT soniq_enqueue('trust.unique', %s::jsonb, unique_job => true, queue => 'q')",
            [text]).fetchone()[0]
        assert conn.execute(
            "SELECT soniq_enqueue('trust.unique', %s::jsonb, unique_job => true)",
            [text]).fetchone()[0] == unique
        keyed = conn.execute(
            "SELECT soniq_enqueue('trust.keyed', '{}', dedup_key => 'k', unique_job => true)"
        ).fetchone()[0]
        assert conn.execute(
            "SELECT soniq_enqueue('trust.other', '{\"x\": 1}', dedup_key => 'k')"
        ).fetchone()[0] == keyed
        assert conn.execute(
            "SELECT soniq_enqueue('trust.keyed', '{}', dedup_key => 'k2', unique_job => true)"
        ).fetchone()[0] == keyed
        assert conn.execute("SELECT soniq_args_hash(%s::jsonb)", [text]).fetchone()[0] == (
            args_hash(args))
        # soniq_enqueue_many: plain, unique (the per-row path), dedup, scheduled, errors.
        batch = conn.execute("SELECT soniq_enqueue_many(%s::jsonb)", [json.dumps([
            {"job_name": "trust.many", "args": args, "queue": "m", "priority": 3,
             "max_attempts": None, "run_at": "2020-01-01T00:00:00Z"},
            {"job_name": "trust.many_later", "run_at": "2999-01-01T00:00:00Z"},
            {"job_name": "trust.unique", "args": args, "unique_job": True},
            {"job_name": "trust.other", "dedup_key": "k"},
            {"job_name": "trust.many_new", "args": {"big": "x" * 400}, "dedup_key": "k9"},
        ])]).fetchone()[0]
        assert batch[2:4] == [unique, keyed]
        for jobs, hint in [
            ([{"job_name": "Bad Name"}], "SONIQ_INVALID_TASK_NAME"),
            ([{"job_name": "a.b", "args": {"n": 1e308, "pad": "x" * 400}},
              {"job_name": "a.b", "args": {"n": 10**400}}], "SONIQ_TASK_ARGS_INVALID"),
            ([{"job_name": "a.b", "args": []}], "SONIQ_TASK_ARGS_INVALID"),
            ([{"job_name": "a.b", "max_attempts": 0}], "SONIQ_INVALID_MAX_ATTEMPTS"),
            ([{"job_name": "a.b", "queue": ""}], "SONIQ_INVALID_OPTION"),
            ([{"job_name": "a.b", "extra": 1}], "SONIQ_INVALID_OPTION"),
            ([1], "SONIQ_INVALID_OPTION"),
        ]:
            assert_refused(conn, "SELECT soniq_enqueue_many(%s::jsonb)", "22023", hint,
                           params=[json.dumps(jobs)])
        assert_refused(conn, "SELECT soniq_enqueue_many(%s::jsonb)", "23505",
                       params=[json.dumps([{"job_name": "a.b", "job_id": str(plain)}])])
        assert_refused(conn, "SELECT soniq_enqueue('Bad Name', '{}')", "22023",
                       "SONIQ_INVALID_TASK_NAME")
        assert_refused(conn, "SELECT soniq_enqueue('a.b', '{\"n\": 1e400}')", "22023",
                       "SONIQ_TASK_ARGS_INVALID")
        assert_refused(conn, "SELECT soniq_enqueue('a.b', '[]')", "22023",
                       "SONIQ_TASK_ARGS_INVALID")
        assert_refused(conn, "SELECT soniq_enqueue('a.b', '{}', max_attempts => 0)", "22023",
                       "SONIQ_INVALID_MAX_ATTEMPTS")
        assert_refused(conn, "SELECT soniq_enqueue('a.b', '{}', queue => '')", "22023",
                       "SONIQ_INVALID_OPTION")
        assert_refused(conn, "SELECT soniq_args_hash('[]')", "22023", "SONIQ_TASK_ARGS_INVALID")
        assert_refused(conn, "SELECT soniq_enqueue('a.b', '{}', job_id => %s)", "23505",
                       params=[plain])
        row = conn.execute(
            "SELECT id, job_name, status, queue FROM soniq_get_job(%s)", [unique]).fetchone()
        assert row == (unique, "trust.unique", "queued", "q")
        dead = DeadLetterJob.objects.create(
            id=uuid.uuid4(), job_name="trust.dead", args={}, dead_letter_reason="job_not_found")
        assert conn.execute("SELECT status FROM soniq_get_job(%s)", [dead.id]).fetchone() == (
            "dead_letter",)
        assert conn.execute("SELECT count(*) FROM soniq_jobs").fetchone()[0] == 0  # the decoy
    assert not [n for n in notices if PLANTED in (n or "")]

    jobs = {job.id: job for job in Job.objects.all()}
    assert set(jobs) == {plain, unique, keyed, batch[0], batch[1], batch[4]}
    assert (jobs[batch[0]].args, jobs[batch[0]].max_attempts, jobs[batch[0]].queue) == (
        args, None, "m")
    assert jobs[plain].args == args and jobs[plain].producer_id == attacker
    assert jobs[unique].args_hash == args_hash(args)
    with raw() as admin:
        for table in ("soniq_jobs", "soniq_dead_letter_jobs"):
            count = admin.execute(
                f"SELECT count(*) FROM {quote_ident(own_schema)}.{table}").fetchone()[0]
            assert count == 0


# --------------------------------------------------------------------------
# The task-name pattern cannot be loosened by a caller


def _alter_database(admin, clause):
    admin.execute(f"ALTER DATABASE {quote_ident(connection.settings_dict['NAME'])} {clause}")


def test_a_callers_set_changes_nothing(roles):
    role = roles.create("soniq_producer")
    grant(role)
    with roles.connect(role) as conn:
        for statement in ["SET soniq.task_name_pattern = '^.+$'",
                          "SELECT set_config('soniq.task_name_pattern', '^.+$', false)"]:
            conn.execute(statement)
            assert conn.execute("SHOW soniq.task_name_pattern").fetchone()[0] == "^.+$"
            assert_refused(conn, "SELECT soniq_enqueue('Not Allowed', '{}')", "22023",
                           "SONIQ_INVALID_TASK_NAME")
        with pytest.raises(psycopg.Error) as caught, conn.transaction():
            conn.execute("SET LOCAL soniq.task_name_pattern = '^.+$'")
            conn.execute("SELECT soniq_enqueue('Not Allowed', '{}')")
        assert (caught.value.sqlstate, caught.value.diag.message_hint) == (
            "22023", "SONIQ_INVALID_TASK_NAME")
    assert Job.objects.count() == 0


def test_role_settings_change_nothing(roles):
    loose = roles.create("soniq_loose")
    strict = roles.create("soniq_strict")
    database = quote_ident(connection.settings_dict["NAME"])
    for role in (loose, strict):
        grant(role)
    with raw() as admin:
        admin.execute(f"ALTER ROLE {quote_ident(loose)} SET soniq.task_name_pattern = '^.+$'")
        admin.execute(f"ALTER ROLE {quote_ident(strict)} IN DATABASE {database} "
                      "SET soniq.task_name_pattern = '^nothing$'")
    with roles.connect(loose) as conn:
        assert conn.execute("SHOW soniq.task_name_pattern").fetchone()[0] == "^.+$"
        assert_refused(conn, "SELECT soniq_enqueue('Not Allowed', '{}')", "22023",
                       "SONIQ_INVALID_TASK_NAME")
    with roles.connect(strict) as conn:
        assert conn.execute("SHOW soniq.task_name_pattern").fetchone()[0] == "^nothing$"
        assert conn.execute("SELECT soniq_enqueue('billing.send_invoice', '{}')").fetchone()[0]
    assert Job.objects.count() == 1


def test_a_producer_cannot_set_the_pattern_for_the_database_or_itself(roles):
    role = roles.create("soniq_producer")
    grant(role)
    database = quote_ident(connection.settings_dict["NAME"])
    with roles.connect(role) as conn:
        assert_refused(conn, f"ALTER DATABASE {database} SET soniq.task_name_pattern = '^.+$'",
                       "42501")
        try:
            conn.execute(f"ALTER ROLE {quote_ident(role)} SET soniq.task_name_pattern = '^.+$'")
            altered = True
        except Exception as exc:  # some versions refuse placeholders to non-superusers
            assert getattr(exc, "sqlstate", None) == "42501", exc
            altered = False
    with roles.connect(role) as conn:
        if altered:
            assert conn.execute("SHOW soniq.task_name_pattern").fetchone()[0] == "^.+$"
        assert_refused(conn, "SELECT soniq_enqueue('Not Allowed', '{}')", "22023",
                       "SONIQ_INVALID_TASK_NAME")


def test_the_database_setting_applies_at_once_to_open_sessions(roles):
    role = roles.create("soniq_producer")
    grant(role)
    with roles.connect(role) as conn, raw() as admin:
        try:
            _alter_database(admin, "SET soniq.task_name_pattern = '^[A-Z]+$'")
            assert conn.execute("SELECT soniq_enqueue('UPPER', '{}')").fetchone()[0]
            assert_refused(conn, "SELECT soniq_enqueue('billing.send_invoice', '{}')", "22023",
                           "SONIQ_INVALID_TASK_NAME")
        finally:
            _alter_database(admin, "RESET soniq.task_name_pattern")
        assert conn.execute("SELECT soniq_enqueue('billing.send_invoice', '{}')").fetchone()[0]
        assert_refused(conn, "SELECT soniq_enqueue('UPPER', '{}')", "22023",
                       "SONIQ_INVALID_TASK_NAME")

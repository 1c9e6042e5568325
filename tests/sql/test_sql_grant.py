"""``manage.py soniq_grant ROLE``: what it grants, what it prints, where it refuses."""

import io

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction

from tests.support.sql import PUBLIC_FUNCTIONS, fetch, quote_ident, schema, unique_name

ENQUEUE_SIGNATURE = (
    "soniq_enqueue(text, jsonb, text, integer, timestamptz, integer, boolean, text, text, uuid)"
)

ENQUEUE_AFTER_SIGNATURE = (
    "soniq_enqueue_after(uuid[], text, jsonb, text, integer, timestamptz, integer, boolean, text,"
    " text, uuid, boolean, double precision)"
)


ENQUEUE_KEYED_SIGNATURE = (
    "soniq_enqueue_keyed(text, integer, text, text, jsonb, text, integer, timestamptz, integer,"
    " boolean, text, text, uuid)"
)


ENQUEUE_KEYED_AFTER_SIGNATURE = (
    "soniq_enqueue_keyed_after(text, integer, text, uuid[], text, jsonb, text, integer,"
    " timestamptz, integer, boolean, text, text, uuid, boolean, double precision)"
)


def _grant(role) -> list[str]:
    out = io.StringIO()
    call_command("soniq_grant", role, stdout=out)
    return out.getvalue().splitlines()


def _create_role(name):
    fetch(f"CREATE ROLE {quote_ident(name)}")  # rolled back with the test's transaction


def _can_execute(role) -> dict[str, bool]:
    rows = fetch(
        "SELECT p.proname, has_function_privilege(%s, p.oid, 'EXECUTE') FROM pg_proc AS p "
        "WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'soniq\\_%%'",
        [role],
    )
    return dict(rows)


@pytest.mark.django_db
def test_soniq_grant_grants_the_producer_functions_or_refuses_off_postgresql(backend):
    role = unique_name("soniq_grantee")
    if backend != "postgresql":
        with pytest.raises(CommandError, match="PostgreSQL"):
            call_command("soniq_grant", role, stdout=io.StringIO())
        return
    _create_role(role)
    quoted_schema, quoted_role = quote_ident(schema()), quote_ident(role)
    assert _grant(role) == [
        f"GRANT USAGE ON SCHEMA {quoted_schema} TO {quoted_role}",
        f"GRANT EXECUTE ON FUNCTION {quoted_schema}.{ENQUEUE_SIGNATURE} TO {quoted_role}",
        f"GRANT EXECUTE ON FUNCTION {quoted_schema}.soniq_get_job(uuid) TO {quoted_role}",
        f"GRANT EXECUTE ON FUNCTION {quoted_schema}.soniq_args_hash(jsonb) TO {quoted_role}",
        f"GRANT EXECUTE ON FUNCTION {quoted_schema}.soniq_enqueue_many(jsonb) TO {quoted_role}",
        f"GRANT EXECUTE ON FUNCTION {quoted_schema}.{ENQUEUE_AFTER_SIGNATURE} TO {quoted_role}",
        f"GRANT EXECUTE ON FUNCTION {quoted_schema}.soniq_enqueue_after_many(jsonb, double "
        f"precision) TO {quoted_role}",
        f"GRANT EXECUTE ON FUNCTION {quoted_schema}.{ENQUEUE_KEYED_SIGNATURE} TO {quoted_role}",
        f"GRANT EXECUTE ON FUNCTION {quoted_schema}.{ENQUEUE_KEYED_AFTER_SIGNATURE} TO "
        f"{quoted_role}",
        f"GRANT EXECUTE ON FUNCTION {quoted_schema}.soniq_enqueue_keyed_many(jsonb) TO "
        f"{quoted_role}",
    ]
    assert fetch("SELECT has_schema_privilege(%s, current_schema(), 'USAGE')", [role]) == [(True,)]
    executable = _can_execute(role)
    assert sorted(name for name, ok in executable.items() if ok) == sorted(PUBLIC_FUNCTIONS)
    assert fetch("SELECT has_table_privilege(%s, 'soniq_jobs', 'SELECT')", [role]) == [(False,)]
    # Granting twice is harmless.
    assert len(_grant(role)) == 10



@pytest.mark.postgresql_only
@pytest.mark.django_db
def test_an_unknown_role_is_a_command_error():
    with pytest.raises(CommandError, match="role exists"), transaction.atomic():
        call_command("soniq_grant", unique_name("soniq_nobody"), stdout=io.StringIO())


@pytest.mark.postgresql_only
@pytest.mark.django_db
@pytest.mark.parametrize("shape", ['soniq "quoted" role {}', "Soniq Mixed Case {}", "soniq.dot-{}"])
def test_any_role_name_is_taken_literally(shape):
    role = shape.format(unique_name("x"))
    _create_role(role)
    assert len(_grant(role)) == 10
    assert _can_execute(role)["soniq_enqueue"] is True
    assert _can_execute(role)["soniq_enqueue_after"] is True
    assert _can_execute(role)["soniq_enqueue_after_many"] is True


@pytest.mark.postgresql_only
@pytest.mark.django_db
def test_a_role_name_cannot_smuggle_sql():
    first, second = unique_name("soniq_a"), unique_name("soniq_b")
    _create_role(first)
    _create_role(second)
    # Unescaped, this would grant to both roles and succeed.
    with pytest.raises(CommandError), transaction.atomic():  # a savepoint: the GRANT fails
        call_command("soniq_grant", f'{first}", "{second}', stdout=io.StringIO())
    assert not any(_can_execute(second).values())
    assert not any(_can_execute(first).values())

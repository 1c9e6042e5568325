"""Grant producers the SQL API (PostgreSQL)."""

from django.db import connections

from .sql import table_schema

#: The functions a producer may call, with their argument types.
PRODUCER_FUNCTIONS = (
    "soniq_enqueue(text, jsonb, text, integer, timestamptz, integer, boolean, text, text, uuid)",
    "soniq_get_job(uuid)",
    "soniq_args_hash(jsonb)",
    "soniq_enqueue_many(jsonb)",
    # producer_api_v5.sql (migration 0025_workflows): enqueue with depends_on.
    "soniq_enqueue_after(uuid[], text, jsonb, text, integer, timestamptz, integer, boolean, text,"
    " text, uuid, boolean, double precision)",
    # producer_api_v6.sql (migration 0027_enqueue_after_many): many of them in one call.
    "soniq_enqueue_after_many(jsonb, double precision)",
    # claim_protocol_v12.sql (migration 0029_keys): enqueue a job limited per key.
    "soniq_enqueue_keyed(text, integer, text, text, jsonb, text, integer, timestamptz, integer,"
    " boolean, text, text, uuid)",
)


def _quote_identifier(name: str) -> str:
    """``name`` as a PostgreSQL quoted identifier, embedded double quotes doubled.

    (Django's ``quote_name`` does not escape them, so a role name holding a
    ``"`` would end the identifier early and the rest would run as SQL.)
    """
    return '"' + name.replace('"', '""') + '"'


def grant_producer(role: str, *, using: str = "default") -> list[str]:
    """Grant ``role`` USAGE on the soniq schema and EXECUTE on the producer functions.

    Returns the statements run. Raises ``ValueError`` on a database that is
    not PostgreSQL; database errors (an unknown role, missing privileges)
    propagate.
    """
    connection = connections[using]
    if connection.vendor != "postgresql":
        raise ValueError("the SQL API exists on PostgreSQL only")
    schema = _quote_identifier(table_schema(connection))
    grantee = _quote_identifier(role)
    statements = [f"GRANT USAGE ON SCHEMA {schema} TO {grantee}"] + [
        f"GRANT EXECUTE ON FUNCTION {schema}.{function} TO {grantee}"
        for function in PRODUCER_FUNCTIONS
    ]
    with connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)
    return statements

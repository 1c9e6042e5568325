"""Grant a PostgreSQL role the SQL API of a producer or of a worker, and nothing else."""

from django.db import connections, transaction

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
    # key_park_v1.sql (migration 0032_key_park): a job limited per key that waits for others,
    # many keyed jobs in one call.
    "soniq_enqueue_keyed_after(text, integer, text, uuid[], text, jsonb, text, integer,"
    " timestamptz, integer, boolean, text, text, uuid, boolean, double precision)",
    "soniq_enqueue_keyed_many(jsonb)",
)

#: The functions a worker may call: register, claim, keep, settle and recover its claims.
#: Not soniq_enqueue (a worker that enqueues gets the producer grant too), nor
#: soniq_request_cancel (an operator's). docs/claim-protocol.md says what each does.
WORKER_FUNCTIONS = (
    # worker_registry_v1.sql (migration 0030): the worker's row and its job names.
    "soniq_register_worker(uuid, text[], text[], text, integer, text, integer[], integer)",
    "soniq_worker_heartbeat(uuid, text)",
    # The claim protocol (claim_protocol_v1 ... v11).
    "soniq_claim(text, text, text[], double precision, double precision, integer)",
    "soniq_claim_many(text, text[], text[], double precision, double precision, integer)",
    "soniq_recover_claim(text, text)",
    "soniq_heartbeat(text, text, bigint, text, text, double precision)",
    "soniq_complete(text, text, bigint, text, text, jsonb, double precision)",
    "soniq_complete_many(text[], text, bigint[], text[], text[], jsonb[], double precision)",
    "soniq_fail(text, text, bigint, text, text, text, boolean, double precision, text, text,"
    " integer, double precision, double precision)",
    "soniq_defer(text, text, bigint, text, text, text, double precision, double precision)",
    "soniq_set_pid(text, text, bigint, text, text, integer)",
    "soniq_get_state(text, text, bigint, text, text)",
    "soniq_acknowledge_cancel(text, text, bigint, text, text, double precision)",
    "soniq_hold_slot(text, text, bigint, text, text, double precision)",
    "soniq_renew_holds(text, text[], bigint[], double precision)",
    "soniq_release_hold(text, text, bigint)",
    # worker_registry_v1.sql: what became of a claim after an unacknowledged write.
    "soniq_claim_outcome(text, text, bigint, text)",
    # job_progress_v1.sql (migration 0024, issue 29): progress under the claim's fence.
    "soniq_set_progress(text, text, bigint, text, text, bigint, bigint, text)",
    # steps_v1.sql (migration 0028, issue 30): a durable step's lookup and fenced record.
    "soniq_get_step(text, text, bigint, text, text, text)",
    "soniq_record_step(text, text, bigint, text, text, text, jsonb, integer)",
    # claim_protocol_v12.sql (migration 0029, issue 31): give back the key slots of
    # lapsed holds (a worker that keeps holds calls it now and then).
    "soniq_key_sweep()",
    # claim_protocol_v14.sql (migration 0034): settle lapsed leases read from the start (what
    # a claim under a pinned horizon does only every 300 s; the housekeeping's, once a minute).
    "soniq_settle_lapsed(double precision)",
)

#: What each grant names, by the command's flag.
GRANTS = {"producer": PRODUCER_FUNCTIONS, "worker": WORKER_FUNCTIONS}


def _quote_identifier(name: str) -> str:
    """``name`` as a PostgreSQL quoted identifier, embedded double quotes doubled.

    (Django's ``quote_name`` does not escape them, so a role name holding a
    ``"`` would end the identifier early and the rest would run as SQL.)
    """
    return '"' + name.replace('"', '""') + '"'


def grant(role: str, functions: tuple[str, ...], *, using: str = "default") -> list[str]:
    """Grant ``role`` USAGE on the soniq schema and EXECUTE on ``functions``, in one transaction.

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
        f"GRANT EXECUTE ON FUNCTION {schema}.{function} TO {grantee}" for function in functions
    ]
    with transaction.atomic(using=using), connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)
    return statements


def grant_producer(role: str, *, using: str = "default") -> list[str]:
    """Grant ``role`` the producer functions (``grant``)."""
    return grant(role, PRODUCER_FUNCTIONS, using=using)


def grant_worker(role: str, *, using: str = "default") -> list[str]:
    """Grant ``role`` the worker functions (``grant``)."""
    return grant(role, WORKER_FUNCTIONS, using=using)

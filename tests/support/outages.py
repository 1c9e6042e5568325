"""A lost database connection, on demand (PostgreSQL).

``lose_connection()`` ends the server process behind Django's default
connection from a second connection, as a server restart or a network cut
would: the next query on it fails as on a dead connection, and Django
reconnects once the test closes it (``connection.close()``).
"""

from django.db import connection, connections


def lose_connection() -> None:
    """Terminate the backend of this thread's ``default`` connection, from another one."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    other = connections.create_connection("default")
    with other.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    other.close()

"""Deployment tests: soniq_django behind a real PgBouncer in transaction mode (PostgreSQL pass).

tests/support/pgbouncer.py starts Debian's PgBouncer in front of the test
server; producers (client.py) and workers run as separate processes with
settings.py, reaching the database only through it.
"""

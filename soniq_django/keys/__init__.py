"""Limits per key: at most N jobs of one key running at once, at most N starts in a window.

``models.py`` holds the tables; ``options.py`` checks ``@job(concurrency_key=...,
key_concurrency=..., key_rate=...)`` and computes a job's key (producer/keyed.py
writes keyed jobs: ``soniq_enqueue_keyed`` on PostgreSQL, its twin on SQLite);
``limits.py`` is the operators' side (overrides, what the keys look like now). The
counting itself is in the database (sql/claim_protocol_v12.sql). See
docs/keys.md.
"""

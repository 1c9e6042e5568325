"""Code that migrations run: admission checks, catalog reads, the owned metadata, Soniq's tables.

These modules are frozen helpers, like the released files in ``sql/``: a
migration that shipped must do tomorrow exactly what it did the day it
shipped, so they import nothing from the live package but ``errors`` and
each other, and they change only to fix a defect in what they always did.
A new schema change gets a new function (or module) and a new migration;
``tests/schema/test_migrations.py`` checks that migrations import nothing else.

- ``admission``: the admission checks of migration 0003 (``soniq_check_schema``);
- ``catalog``: read-only facts about columns and indexes on both backends;
- ``owned_metadata``: what migration 0003 adds, and the controlled downgrade;
- ``worker_tables``: migration 0006, Soniq's own worker and registry tables.
- ``operations``: ``RunWithoutModels``, the ``RunPython`` every migration's SQL step uses.
"""

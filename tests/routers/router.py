"""The router of the separate-jobs-database project (tests/routers/settings.py).

soniq_django's tables live in ``jobs``: its migrations run there only, its
writes go there, and its reads go to ``jobs_replica`` (a read-only
connection to the same database). Every other app lives in ``default``.
docs/deployment.md shows the same router.
"""

SONIQ_APP = "soniq_django"


class JobsRouter:
    def db_for_read(self, model, **hints):
        return "jobs_replica" if model._meta.app_label == SONIQ_APP else None

    def db_for_write(self, model, **hints):
        return "jobs" if model._meta.app_label == SONIQ_APP else None

    def allow_relation(self, obj1, obj2, **hints):
        return None

    def allow_migrate(self, db, app_label, model_name=None, **hints):
        if app_label == SONIQ_APP:
            return db == "jobs"
        return db == "default"

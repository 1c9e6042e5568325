"""Worker processes (``manage.py soniq_worker``) on a database a test names, and their logs.

Each child runs with ``tests.worker_settings``: the database from
``SONIQ_WORKER_DATABASE_URL`` (passed in the environment, never printed),
soniq settings from ``SONIQ_*`` variables, and the test handlers of
tests/testapp/jobs.py. The children are ``tests.support.processes``
children; whoever starts them kills them at the end (``kill_all()``), as
the ``children`` fixture of tests/conftest.py does.
"""

from pathlib import Path
from urllib.parse import quote

from tests.support.processes import Child, Processes

__all__ = ["Child", "Children", "database_url"]


def database_url(connection) -> str:
    """The URL of the database ``connection`` is on (the test database). Never print it."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return "sqlite:///" + str(Path(db["NAME"]).resolve())
    credentials = quote(db["USER"] or "", safe="")
    if db["PASSWORD"]:
        credentials += ":" + quote(db["PASSWORD"], safe="")
    host = quote(db["HOST"] or "", safe="")  # a socket directory is percent-encoded
    port = f":{db['PORT']}" if db["PORT"] else ""
    return f"postgres://{credentials}@{host}{port}/{quote(db['NAME'], safe='')}"


class Children(Processes):
    """``manage.py`` processes against the database at ``url``, with the test handlers.

    The parent's ``SONIQ_*`` variables are passed on (a fixture's run log,
    for one), then the keywords of ``start()``.
    """

    def __init__(self, folder: Path, url: str, env: dict | None = None):
        super().__init__(folder, "tests.worker_settings",
                         {**(env or {}), "SONIQ_WORKER_DATABASE_URL": url},
                         inherit_soniq_env=True)
        self.url = url

    @property
    def started(self) -> list[Child]:
        return self.children

    def start(self, *args: str, env: dict | None = None, **soniq) -> Child:  # type: ignore[override]
        """Start ``manage.py *args`` with ``SONIQ[name] = value`` for each keyword."""
        return self.manage(*args, env=env, **soniq)

    def kill_all(self) -> None:
        self.cleanup()

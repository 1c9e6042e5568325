"""Worker processes (``manage.py soniq_worker``) on a database a test names, and their logs.

Each child runs with ``tests.worker_settings``: the database from
``SONIQ_WORKER_DATABASE_URL`` (passed in the environment, never printed),
soniq settings from ``SONIQ_*`` variables, and the test handlers of
tests/testapp/jobs.py. Whoever starts children kills them at the end.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[2]


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


class Child:
    """One ``manage.py`` process and its output file."""

    def __init__(self, process: subprocess.Popen, output: Path):
        self.process = process
        self.output = output

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"process {self.pid} still running after {timeout} s; its "
                                 f"log ends:\n{self.log()[-3000:]}") from None

    def log(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    def count(self, text: str) -> int:
        """How many lines of its log contain ``text``."""
        return sum(text in line for line in self.log().splitlines())

    def done_lines(self) -> list[str]:
        """The job ids this worker logged as completed (one log line per job)."""
        return re.findall(r" ([0-9a-f-]{36}) done after ", self.log())


class Children:
    """Starts ``manage.py`` processes against one database; ``kill_all()`` ends what is left."""

    def __init__(self, folder: Path, url: str, env: dict | None = None):
        self.folder = folder
        self.url = url
        self.env = env or {}
        self.started: list[Child] = []

    def start(self, *args: str, env: dict | None = None, **soniq) -> Child:
        """Start ``manage.py *args`` with ``SONIQ[name] = value`` for each keyword."""
        environment = {**os.environ, **self.env, "DJANGO_SETTINGS_MODULE": "tests.worker_settings",
                       "SONIQ_WORKER_DATABASE_URL": self.url, "PYTHONUNBUFFERED": "1"}
        environment.update({f"SONIQ_{name}": json.dumps(value) for name, value in soniq.items()})
        environment.update(env or {})
        output = self.folder / f"child-{len(self.started)}.log"
        with open(output, "wb") as sink:
            process = subprocess.Popen([sys.executable, "manage.py", *args], cwd=ROOT,
                                       env=environment, stdin=subprocess.DEVNULL, stdout=sink,
                                       stderr=subprocess.STDOUT)
        child = Child(process, output)
        self.started.append(child)
        return child

    def kill_all(self) -> None:
        for child in self.started:
            if child.alive:
                child.process.kill()
        for child in self.started:
            try:
                child.process.wait(10)
            except subprocess.TimeoutExpired:  # pragma: no cover - a stuck kill
                pass

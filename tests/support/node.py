"""The reference Node worker (contrib/node-worker/) as a child process of a test.

``ensure_node_worker()`` finds Node and installs the worker's one package
(``pg``, from the npm registry, pinned by package-lock.json) with ``npm ci``
when node_modules lacks it -- as tests/support/pgbouncer.py's caller installs
PgBouncer; without Node or npm it raises ``NodeUnavailable``, which a
fixture turns into a skip (a failure under CI=true). ``NodeWorkers`` starts
``node worker.js <handlers>`` children logging in with a URL the test gives
(never printed), each in its own session with its output in a file, and
kills what is left at the end. Each line a worker prints is one JSON event.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

from tests.support.processes import Child, kill_all

ROOT = Path(__file__).resolve().parents[2]
WORKER_DIR = ROOT / "contrib" / "node-worker"


class NodeUnavailable(RuntimeError):
    """No node binary, or the pg package could not be installed."""


def ensure_node_worker() -> str:
    """The node executable, with contrib/node-worker's dependencies installed."""
    node = shutil.which("node")
    if node is None:
        raise NodeUnavailable("node is not installed (the reference worker needs Node 18 or later)")
    if not (WORKER_DIR / "node_modules" / "pg" / "package.json").exists():
        npm = shutil.which("npm")
        if npm is None:
            raise NodeUnavailable("npm is not installed: cannot install the pg package")
        done = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=WORKER_DIR,
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise NodeUnavailable(f"npm ci failed in contrib/node-worker: {done.stderr[-500:]}")
    return node


class NodeWorker(Child):
    """One Node worker process; ``events()`` are the JSON lines it printed."""

    def events(self, kind: str | None = None) -> list[dict]:
        found = []
        for line in self.log().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and (kind is None or event.get("event") == kind):
                found.append(event)
        return found


class NodeWorkers:
    """Starts Node workers on ``url`` with ``handlers`` (a .js file); kills them at the end."""

    def __init__(self, folder: Path, url: str, handlers: Path, **settings: object):
        self.node = ensure_node_worker()
        self.folder, self.url, self.handlers = folder, url, handlers
        self.settings = {f"SONIQ_{name.upper()}": str(value) for name, value in settings.items()}
        self.started: list[NodeWorker] = []

    def start(self) -> NodeWorker:
        env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
        env.update(self.settings, DATABASE_URL=self.url)
        output = self.folder / f"node-{len(self.started)}.log"
        with open(output, "wb") as sink:
            process = subprocess.Popen(
                [self.node, str(WORKER_DIR / "worker.js"), str(self.handlers)], cwd=WORKER_DIR,
                env=env, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                start_new_session=True)
        worker = NodeWorker(process, output)
        self.started.append(worker)
        return worker

    def cleanup(self) -> None:
        kill_all(self.started)

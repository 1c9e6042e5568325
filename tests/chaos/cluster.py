"""A throwaway PostgreSQL cluster the chaos run owns: initdb, pg_ctl start/stop, delete.

The chaos run restarts its database on purpose, so it never uses a shared
server: it makes its own cluster in a temporary directory under /tmp, on a
free 127.0.0.1 port with trust authentication, and deletes it at the end,
whatever happened. As root it runs the server binaries as the ``postgres`` OS
user (initdb refuses root), like scripts/run-tests.

The binaries come from ``SONIQ_CHAOS_PG_BINDIR`` when set (a directory that
must hold initdb and pg_ctl), else from PATH, else from the newest
/usr/lib/postgresql/*/bin.

Durability: ``fsync=off`` (no disk flushes; the data survives a killed
server, since the kernel still holds it, but not a power cut) and
``synchronous_commit`` left *on*, so a commit the client saw acknowledged is
in the WAL the crash recovery of an immediate shutdown replays. With
``synchronous_commit=off`` an immediate shutdown could silently drop
acknowledged commits, and the chaos checker would rightly call that loss.
"""

import glob
import os
import pwd
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


class ClusterUnavailable(RuntimeError):
    """The machine cannot host a throwaway cluster (no initdb/pg_ctl, no postgres user)."""


def find_bindir() -> Path:
    explicit = os.environ.get("SONIQ_CHAOS_PG_BINDIR")
    if explicit:
        candidates = [Path(explicit)]
    else:
        candidates = []
        initdb = shutil.which("initdb")
        if initdb:
            candidates.append(Path(initdb).resolve().parent)
            candidates.append(Path(initdb).parent)
        candidates += [Path(p) for p in sorted(
            glob.glob("/usr/lib/postgresql/*/bin"),
            key=lambda p: [int(x) if x.isdigit() else x for x in Path(p).parent.name.split(".")],
            reverse=True)]
    for directory in candidates:
        if (directory / "initdb").is_file() and (directory / "pg_ctl").is_file():
            return directory
    where = explicit or "PATH or /usr/lib/postgresql/*/bin"
    raise ClusterUnavailable(f"initdb and pg_ctl not found in {where}")


def free_port() -> int:
    """A free 127.0.0.1 port below the kernel's ephemeral range when possible.

    The server is down for seconds at a time during the run; an ephemeral
    port could meanwhile be handed to some outgoing connection and block the
    restart.
    """
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    candidates = random.sample(range(20000, low), min(50, low - 20000)) if low > 20100 else []
    for port in [*candidates, 0]:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return sock.getsockname()[1]
    raise ClusterUnavailable("no free port on 127.0.0.1")


class Cluster:
    """One private PostgreSQL server. Use as a context manager: it is always deleted."""

    def __init__(self, database: str = "soniq_chaos", max_connections: int = 200):
        self.bindir = find_bindir()
        self.max_connections = max_connections
        self.owner: str | None = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                raise ClusterUnavailable(
                    "running as root and there is no 'postgres' OS user to run initdb as"
                ) from None
            self.owner = "postgres"
        self.database = database
        self.port = free_port()
        self.dir: Path | None = None
        self.running = False

    # Paths and URLs ------------------------------------------------------

    @property
    def data(self) -> Path:
        return self.dir / "data"

    @property
    def log_path(self) -> Path:
        return self.dir / "server.log"

    def url(self, database: str | None = None) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database or self.database}"

    # Commands --------------------------------------------------------------

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self.owner:
            command = ["runuser", "-u", self.owner, "--", *command]
        return subprocess.run(command, cwd=self.dir, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def _check(self, what: str, result: subprocess.CompletedProcess) -> None:
        if result.returncode != 0:
            raise RuntimeError(
                f"{what} failed ({result.returncode}): {result.stderr.strip()[-2000:]}\n"
                f"server log tail:\n{self.log_tail()}"
            )

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def create(self) -> "Cluster":
        """initdb, start, create the database."""
        self.dir = Path(tempfile.mkdtemp(prefix="soniq-chaos-pg.", dir="/tmp"))
        if self.owner:
            shutil.chown(self.dir, self.owner)
        result = self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                           "--encoding=UTF8", "--no-locale", "--no-sync")
        self._check("initdb", result)
        self.start()
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.database}"')
        return self

    def start(self) -> None:
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} "
                   f"-c fsync=off -c max_connections={self.max_connections}")
        result = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log_path), "-w",
                           "-t", "120", "-o", options, "start")
        self._check("pg_ctl start", result)
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl -m fast|immediate|smart stop``, waiting until the server is gone."""
        result = self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "120", "stop")
        self._check(f"pg_ctl -m {mode} stop", result)
        self.running = False

    def restart(self, mode: str, downtime: float = 0.0) -> None:
        """Stop with ``mode``, stay down ``downtime`` seconds, start again."""
        self.stop(mode)
        if downtime > 0:
            time.sleep(downtime)
        self.start()

    def destroy(self) -> None:
        """Stop the server (immediately) if it runs, and delete the directory."""
        if self.dir is None:
            return
        try:
            if (self.data / "postmaster.pid").exists():
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop",
                          timeout=60)
        except Exception:
            pass
        pid_file = self.data / "postmaster.pid"
        if pid_file.exists():  # pg_ctl could not stop it: kill the postmaster by its pid
            try:
                pid = int(pid_file.read_text().split()[0])
                os.kill(pid, 9)
                time.sleep(0.5)
            except (OSError, ValueError, IndexError):
                pass
        self.running = False
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None

    def __enter__(self) -> "Cluster":
        try:
            return self.create()
        except BaseException:
            self.destroy()
            raise

    def __exit__(self, *exc) -> None:
        self.destroy()

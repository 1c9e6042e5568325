"""A real PgBouncer for the tests: Debian's ``pgbouncer``, on a free local port.

``PgBouncer(server, pools)`` writes its ini and userlist into a new
directory under /tmp (which the ``postgres`` OS user can reach, unlike
pytest's tmp_path of root), starts the binary in the foreground (as that
user when we are root: PgBouncer refuses to run as root), and waits until
its admin console answers. Each ``Pool`` is one entry of ``[databases]``: a
name clients connect to, the server database behind it, a pool mode and a
size. Authentication is ``trust`` on both sides: clients give the server's
user name, with no password, and PgBouncer logs in to the server as that
user. ``restart()`` keeps the port; ``stop()`` runs at the end whatever
happened, and ``close()`` also deletes the directory.

scripts/run-tests installs the package when it is missing (root with
apt-get); ``find_binary()`` raises ``PgBouncerUnavailable`` otherwise, which
a fixture turns into a skip, or a failure under CI=true.
"""

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import psycopg
from django.db import connection


class PgBouncerUnavailable(RuntimeError):
    """No pgbouncer binary, or no OS user it may run as."""


@dataclass(frozen=True)
class Pool:
    """One ``[databases]`` entry: clients connect to ``name``; PgBouncer to ``dbname`` behind."""

    name: str
    dbname: str
    mode: str = "transaction"
    size: int = 6


@dataclass(frozen=True)
class Server:
    """The PostgreSQL server PgBouncer logs in to."""

    host: str
    port: int
    user: str
    password: str = ""


def find_binary() -> str:
    """The pgbouncer executable (PATH, then Debian's /usr/sbin)."""
    found = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not os.access(found, os.X_OK):
        raise PgBouncerUnavailable(
            "pgbouncer is not installed (scripts/run-tests installs Debian's package as root)")
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_as() -> pwd.struct_passwd | None:
    """The OS user PgBouncer runs as: ourselves, or ``postgres`` when we are root."""
    if os.getuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        raise PgBouncerUnavailable("running as root and there is no 'postgres' OS user "
                                   "(PgBouncer refuses to run as root)") from None


class PgBouncer:
    """One PgBouncer process in front of ``server``, serving ``pools``."""

    def __init__(self, server: Server, pools: list[Pool]):
        self.binary = find_binary()
        self.user = _run_as()
        self.dir = Path(tempfile.mkdtemp(prefix="soniq-pgbouncer.", dir="/tmp"))
        self.server, self.pools = server, pools
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        self._write_config()

    # Configuration ------------------------------------------------------

    def _write_config(self) -> None:
        login = f"host={self.server.host} port={self.server.port} user={self.server.user}"
        if self.server.password:
            login += f" password={self.server.password}"
        entries = [f"{pool.name} = {login} dbname={pool.dbname} pool_mode={pool.mode} "
                   f"pool_size={pool.size}" for pool in self.pools]
        (self.dir / "pgbouncer.ini").write_text("\n".join([
            "[databases]", *entries, "",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {self.port}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {self.dir / 'userlist.txt'}",
            f"admin_users = {self.server.user}",
            "pool_mode = transaction",
            "max_client_conn = 400",
            # A client's first query waits this long for a server connection at most.
            "query_wait_timeout = 30",
            "",
        ]))
        (self.dir / "userlist.txt").write_text(f'"{self.server.user}" ""\n')
        if self.user is not None:
            for path in [self.dir, *self.dir.iterdir()]:
                os.chown(path, self.user.pw_uid, self.user.pw_gid)

    def url(self, pool: str, user: str | None = None) -> str:
        """A client URL for ``pool`` (the admin console is ``pool="pgbouncer"``)."""
        return (f"postgres://{quote(user or self.server.user, safe='')}@127.0.0.1:{self.port}/"
                f"{quote(pool, safe='')}")

    # Process --------------------------------------------------------------

    def start(self, timeout: float = 15.0) -> "PgBouncer":
        """Start PgBouncer and wait until its admin console answers."""
        user = self.user
        with open(self.dir / "stderr.log", "ab") as sink:
            self.process = subprocess.Popen(
                [self.binary, str(self.dir / "pgbouncer.ini")], cwd=self.dir,
                stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                user=user.pw_uid if user else None, group=user.pw_gid if user else None,
                extra_groups=[] if user else None, start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.admin("SHOW VERSION")
                return self
            except psycopg.Error:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("PgBouncer did not start:\n" + self.log_tail()) from None
                time.sleep(0.05)

    def stop(self, how: signal.Signals = signal.SIGTERM, timeout: float = 10.0) -> None:
        """Stop PgBouncer: SIGINT waits for running transactions, SIGTERM and SIGKILL do not."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(how)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)

    def restart(self, how: signal.Signals = signal.SIGTERM, downtime: float = 0.0) -> None:
        """Stop, stay down ``downtime`` seconds, start again on the same port."""
        self.stop(how)
        time.sleep(downtime)
        self.start()

    def admin(self, command: str) -> list[tuple]:
        """Run one admin-console command (``SHOW SERVERS``, ``RECONNECT db``…); its rows."""
        with psycopg.connect(self.url("pgbouncer"), autocommit=True, connect_timeout=3) as conn:
            cursor = conn.execute(command)
            return cursor.fetchall() if cursor.description else []

    def version(self) -> str:
        return self.admin("SHOW VERSION")[0][0]

    def log_tail(self, chars: int = 4000) -> str:
        path = self.dir / "stderr.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def __enter__(self) -> "PgBouncer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop PgBouncer and delete its directory."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def pool_hears(url: str, channel: str, *, size: int = 6) -> bool:
    """Does a server connection of the transaction pool at ``url`` still LISTEN on
    ``channel``? ``size`` clients, each in a transaction, hold every server connection of a
    pool of that size; a NOTIFY sent straight to the server meanwhile is delivered, at their
    commit, to whichever of them still listens."""
    heard: list[object] = []
    holders: list[psycopg.Connection] = []
    try:
        for _ in range(size):
            holder = psycopg.connect(url)
            holder.add_notify_handler(heard.append)
            holder.execute("SELECT pg_backend_pid()")  # BEGIN: a server connection is held
            holders.append(holder)
        with connection.cursor() as cursor:  # straight to the server
            cursor.execute(f"NOTIFY {channel}, 'stray?'")
        for holder in holders:
            holder.commit()
            holder.execute("SELECT 1")
            holder.commit()
    finally:
        for holder in holders:
            holder.close()
    return bool(heard)

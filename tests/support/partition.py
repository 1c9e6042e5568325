"""A real network partition between a client process and PostgreSQL (root and ``ip`` needed).

``Partition(host, port)`` makes a network namespace of its own and a veth
pair: the host end gets 10.231.X.1, the namespace end 10.231.X.2 (a random
/30 of 10.231.0.0/16, addresses that exist only inside what this creates).
A ``Proxy`` on the host end forwards to the server. ``client()`` starts a
Python process inside the namespace that reaches the server through it.
``cut()`` takes the host end down: from then on nothing the client sends
arrives and nothing comes back -- no reset, no refusal, not even an
acknowledgement: a silent peer, as a partition makes it. ``close()``
removes everything (the namespace, the pair, the client).
"""

import os
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from tests.support.ci import unavailable
from tests.support.proxy import Proxy

ROOT = Path(__file__).resolve().parents[2]

#: What the client runs: connect, say so, then block on a query until the connection fails.
CLIENT = textwrap.dedent("""
    import sys, time
    import django
    django.setup()
    from django.db import connections
    from soniq_django.worker.connection import own_connection
    conn = own_connection("default") if sys.argv[1] == "tuned" else connections["default"]
    conn.ensure_connection()
    print("blocked", flush=True)
    started = time.monotonic()
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(600)")
    except Exception as error:
        print("failed", type(error).__name__, round(time.monotonic() - started, 1), flush=True)
""")


def _ip(*args: str, check: bool = True) -> None:
    subprocess.run(["ip", *args], check=check, capture_output=True, timeout=10)


class Client:
    """A process inside the namespace, its output in a file."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        self.output = Path(tempfile.mkstemp(prefix="soniq-partition-", suffix=".log")[1])
        with open(self.output, "wb") as sink:
            self.process = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                            stdout=sink, stderr=subprocess.STDOUT,
                                            start_new_session=True)

    def log(self) -> str:
        return self.output.read_text(errors="replace")

    def wait_for_line(self, start: str, timeout: float) -> bool:
        """Whether a line starting with ``start`` comes within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(line.startswith(start) for line in self.log().splitlines()):
                return True
            if self.process.poll() is not None:
                return any(line.startswith(start) for line in self.log().splitlines())
            time.sleep(0.05)
        return False

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.output.unlink(missing_ok=True)


class Partition:
    """A namespace that reaches ``host:port`` through a veth pair the test can cut."""

    def __init__(self, host: str, port: int):
        if os.geteuid() != 0 or shutil.which("ip") is None:
            unavailable("a network partition needs root and iproute2's ip")
        tag = f"{os.getpid() % 100000}{random.randrange(100)}"
        self.namespace, self.host_end, self.inner_end = f"soniq{tag}", f"sqh{tag}", f"sqn{tag}"
        subnet = f"10.231.{random.randrange(256)}.{4 * random.randrange(64)}"
        base = subnet.rsplit(".", 1)
        self.host_address = f"{base[0]}.{int(base[1]) + 1}"
        inner_address = f"{base[0]}.{int(base[1]) + 2}"
        self.application_name = f"soniq-partition-{tag}"  # every session of its clients
        self.clients: list[Client] = []
        self.proxy: Proxy | None = None
        try:
            _ip("netns", "add", self.namespace)
            _ip("link", "add", self.host_end, "type", "veth", "peer", "name", self.inner_end)
            _ip("link", "set", self.inner_end, "netns", self.namespace)
            _ip("addr", "add", f"{self.host_address}/30", "dev", self.host_end)
            _ip("link", "set", self.host_end, "up")
            inside = ["netns", "exec", self.namespace, "ip"]
            _ip(*inside, "addr", "add", f"{inner_address}/30", "dev", self.inner_end)
            _ip(*inside, "link", "set", self.inner_end, "up")
            _ip(*inside, "link", "set", "lo", "up")
        except (subprocess.CalledProcessError, OSError) as error:
            self.close()
            unavailable(f"cannot make a network namespace here ({type(error).__name__})")
        self.proxy = Proxy(host, port, listen_host=self.host_address)

    def client(self, *, lease: float, tuned: bool) -> Client:
        """Start CLIENT in the namespace, on the test database through the veth pair."""
        from django.db import connection

        assert self.proxy is not None
        db = connection.settings_dict
        credentials = db["USER"] or "postgres"
        if db["PASSWORD"]:
            credentials += f":{db['PASSWORD']}"
        url = f"postgres://{credentials}@{self.host_address}:{self.proxy.port}/{db['NAME']}"
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.worker_settings",
               "SONIQ_WORKER_DATABASE_URL": url, "SONIQ_LEASE_SECONDS": str(lease),
               "SONIQ_TEST_APPLICATION_NAME": self.application_name,
               "PYTHONUNBUFFERED": "1"}
        argv = ["ip", "netns", "exec", self.namespace, sys.executable, "-c", CLIENT,
                "tuned" if tuned else "plain"]
        client = Client(argv, env)
        self.clients.append(client)
        return client

    def cut(self) -> None:
        """From now on nothing crosses: the host end of the pair is down."""
        _ip("link", "set", self.host_end, "down")

    def heal(self) -> None:
        _ip("link", "set", self.host_end, "up")

    def close(self) -> None:
        for client in self.clients:
            client.kill()
        if self.proxy is not None:
            self.proxy.close()
        _ip("link", "del", self.host_end, check=False)
        _ip("netns", "del", self.namespace, check=False)

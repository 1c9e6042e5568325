"""A real network partition between a client process and PostgreSQL (root and ``ip`` needed).

``Partition(host, port)`` makes two network namespaces of its own, a
client's and a router's, joined to this host by veth pairs (a random /29 of
10.231.0.0/16: addresses that exist only inside what this creates, and one
host route to the client's address through the router). A ``Proxy`` on the
host end forwards to the server. ``client()``/``start()`` run a Python
process in the client's namespace that reaches the server through the
router. ``cut()`` turns the router's forwarding off: from then on nothing
the client sends arrives and nothing comes back -- no reset, no refusal,
no ICMP, not even an acknowledgement, and no local error on either end: a
silent peer, as a partition makes it. ``heal()`` turns it on again.
``close()`` removes everything (the namespaces, the pairs, the clients).
"""

import json
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


def _sysctl(namespace: str, forwarding: str) -> None:
    """Turn IPv4 forwarding on ("1") or off ("0") in ``namespace``."""
    subprocess.run(["ip", "netns", "exec", namespace, "sh", "-c",
                    f"echo {forwarding} > /proc/sys/net/ipv4/ip_forward"],
                   check=True, capture_output=True, timeout=10)


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

    def wait_for_line_containing(self, text: str, timeout: float) -> bool:
        """Whether a line containing ``text`` comes within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log():
                return True
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        return text in self.log()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.output.unlink(missing_ok=True)


class Partition:
    """A namespace that reaches ``host:port`` through a router namespace the test can cut.

    host (proxy on .1) --veth-- router (.2 | .5) --veth-- client (.6)

    ``cut()`` turns forwarding off in the router: packets are dropped there
    without a word (no ICMP when forwarding is off), while both ends'
    links stay up, so neither end's kernel sees a local error.
    """

    def __init__(self, host: str, port: int):
        if os.geteuid() != 0 or shutil.which("ip") is None:
            unavailable("a network partition needs root and iproute2's ip")
        tag = f"{os.getpid() % 10000}{random.randrange(100)}"
        self.router, self.namespace = f"sqr{tag}", f"sqc{tag}"
        self.host_end = f"sqh{tag}"
        prefix = f"10.231.{random.randrange(256)}"
        base = 8 * random.randrange(32)
        self.host_address = f"{prefix}.{base + 1}"
        router_left, router_right = f"{prefix}.{base + 2}", f"{prefix}.{base + 5}"
        client_address = f"{prefix}.{base + 6}"
        self.application_name = f"soniq-partition-{tag}"  # every session of its clients
        self.clients: list[Client] = []
        self.proxy: Proxy | None = None
        router = ["netns", "exec", self.router, "ip"]
        inside = ["netns", "exec", self.namespace, "ip"]
        try:
            _ip("netns", "add", self.router)
            _ip("netns", "add", self.namespace)
            _ip("link", "add", self.host_end, "type", "veth", "peer", "name", f"sqa{tag}")
            _ip("link", "set", f"sqa{tag}", "netns", self.router)
            _ip("link", "add", f"sqb{tag}", "type", "veth", "peer", "name", f"sqn{tag}")
            _ip("link", "set", f"sqb{tag}", "netns", self.router)
            _ip("link", "set", f"sqn{tag}", "netns", self.namespace)
            _ip("addr", "add", f"{self.host_address}/30", "dev", self.host_end)
            _ip("link", "set", self.host_end, "up")
            _ip("route", "add", f"{client_address}/32", "via", router_left)
            _ip(*router, "addr", "add", f"{router_left}/30", "dev", f"sqa{tag}")
            _ip(*router, "addr", "add", f"{router_right}/30", "dev", f"sqb{tag}")
            _ip(*router, "link", "set", f"sqa{tag}", "up")
            _ip(*router, "link", "set", f"sqb{tag}", "up")
            _sysctl(self.router, "1")
            _ip(*inside, "addr", "add", f"{client_address}/30", "dev", f"sqn{tag}")
            _ip(*inside, "link", "set", f"sqn{tag}", "up")
            _ip(*inside, "link", "set", "lo", "up")
            _ip(*inside, "route", "add", "default", "via", router_right)
        except (subprocess.CalledProcessError, OSError) as error:
            self.close()
            unavailable(f"cannot make network namespaces here ({type(error).__name__})")
        self.proxy = Proxy(host, port, listen_host=self.host_address)

    def client(self, *, lease: float, tuned: bool) -> Client:
        """Start CLIENT in the namespace: a query blocked on the server (``tuned``: as a worker's)."""
        return self.start(["-c", CLIENT, "tuned" if tuned else "plain"],
                          LEASE_SECONDS=lease)

    def start(self, argv: list[str], **soniq: object) -> Client:
        """Start ``python *argv`` in the namespace, on the test database through the veth pair.

        With ``tests.worker_settings`` and ``SONIQ[name] = value`` for each keyword.
        """
        from django.db import connection

        assert self.proxy is not None
        db = connection.settings_dict
        credentials = db["USER"] or "postgres"
        if db["PASSWORD"]:
            credentials += f":{db['PASSWORD']}"
        url = f"postgres://{credentials}@{self.host_address}:{self.proxy.port}/{db['NAME']}"
        env = {key: value for key, value in os.environ.items() if not key.startswith("SONIQ_")}
        env.update({"DJANGO_SETTINGS_MODULE": "tests.worker_settings",
                    "SONIQ_WORKER_DATABASE_URL": url,
                    "SONIQ_TEST_APPLICATION_NAME": self.application_name,
                    "PYTHONUNBUFFERED": "1"})
        env.update({f"SONIQ_{name}": json.dumps(value) for name, value in soniq.items()})
        client = Client(["ip", "netns", "exec", self.namespace, sys.executable, *argv], env)
        self.clients.append(client)
        return client

    def cut(self) -> None:
        """From now on nothing crosses: the router drops every packet, silently."""
        _sysctl(self.router, "0")

    def heal(self) -> None:
        _sysctl(self.router, "1")

    def close(self) -> None:
        for client in self.clients:
            client.kill()
        if self.proxy is not None:
            self.proxy.close()
        _ip("link", "del", self.host_end, check=False)  # its route goes with it
        _ip("netns", "del", self.namespace, check=False)
        _ip("netns", "del", self.router, check=False)

"""A TCP proxy in the test process that can stop forwarding: a stalled server, on demand.

``Proxy(host, port)`` listens on a free local port (or on ``listen_host``)
and forwards every connection to ``host:port``. ``freeze()`` stops it
forwarding in both directions while every socket stays open: the proxy's
kernel still acknowledges what the client sends (until its buffers fill)
and answers keepalive probes, as a server whose backend was stopped
(SIGSTOP) or a middlebox that hangs would. TCP sees nothing wrong; only a
client-side deadline can end a call then. ``freeze(answers_only=True)``
lets calls through and holds back the answers: the server did the work,
the client never hears of it. ``thaw()`` forwards again.
"""

import select
import socket
import threading


class Proxy:
    """Forwards connections to ``host:port``; ``address`` is where clients connect."""

    def __init__(self, host: str, port: int, *, listen_host: str = "127.0.0.1"):
        self.upstream = (host, port)
        self.frozen = threading.Event()
        self.answers_only = False
        self._closed = threading.Event()
        self._listener = socket.create_server((listen_host, 0))
        self.address = self._listener.getsockname()[:2]
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, name="test-proxy", daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.address[1])

    def freeze(self, *, answers_only: bool = False) -> None:
        """Stop forwarding (connections stay open); ``answers_only``: only the server's way."""
        self.answers_only = answers_only
        self.frozen.set()

    def thaw(self) -> None:
        self.frozen.clear()

    def close(self) -> None:
        self._closed.set()
        for sock in [self._listener, *self._sockets]:
            try:
                sock.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
                server = socket.create_connection(self.upstream)
            except OSError:
                return
            self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        peers = {client: server, server: client}
        try:
            while not self._closed.is_set():
                # What may be read now: nothing while frozen, or only the client's side.
                readable = ([client] if self.answers_only else []) if self.frozen.is_set() \
                    else [client, server]
                if not readable:  # the bytes wait in the kernel's buffers
                    self._closed.wait(0.05)
                    continue
                ready, _, _ = select.select(readable, [], [], 0.05)
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    peers[sock].sendall(data)
        except OSError:
            return
        finally:
            for sock in (client, server):
                try:
                    sock.close()
                except OSError:
                    pass

"""A TCP proxy between a client and PostgreSQL that can lose a COMMIT or stall a connection.

Threads only, no dependency. ``Proxy(upstream_host, upstream_port)`` listens
on a free 127.0.0.1 port (``proxy.port``); each accepted connection gets its
own upstream connection and two forwarding threads. The upstream socket's
local port is the ``client_port`` PostgreSQL shows for that backend in
``pg_stat_activity``: how a test names the connection it aims at.

Faults, each aimed at one connection by its upstream port:

- ``lose_next(port, marker=b"COMMIT")``: the next client-to-server chunk that
  holds ``marker`` is not forwarded; the client side is reset at once (the
  client sees its connection die with the statement unanswered) and the
  server side is kept open and silent until ``close()``. The server never
  learns the client went: its backend stays *idle in transaction* with
  whatever locks the transaction took -- a COMMIT lost in a partition.
- ``stall(port)`` / ``resume(port)``: stop forwarding in both directions
  without closing anything, then go on.
- ``lose_answers(marker, times)``: on any connection, the next ``times``
  client-to-server chunks that hold ``marker`` are forwarded, with what the
  client sends in the next half second; no answer goes back, and then the
  connection is closed on both sides: the server runs the statement (a
  COMMIT commits), the client never hears of it.

And for every connection at once:

- ``freeze()`` / ``thaw()``: stop forwarding in both directions while every
  socket stays open: the proxy's kernel still acknowledges what the client
  sends (until its buffers fill) and answers keepalive probes, as a server
  whose backend was stopped (SIGSTOP) or a middlebox that hangs would. TCP
  sees nothing wrong; only a client-side deadline can end a call then.
  ``freeze(answers_only=True)`` lets calls through and holds back the
  answers: the server did the work, the client never hears of it.

``listen_host`` (default 127.0.0.1) is where it listens (``address``), e.g.
an address inside a network namespace (tests/support/partition.py).

Every wait here is bounded by the sockets' own timeouts (``_TICK``) so that
``close()`` ends every thread within a second.
"""

import socket
import struct
import threading

_TICK = 0.2  # seconds: how often a forwarding thread looks at its connection's state


class _Pair:
    def __init__(self, client: socket.socket, server: socket.socket):
        self.client, self.server = client, server
        self.upstream_port = server.getsockname()[1]
        self.lose_marker: bytes | None = None
        self.lost = threading.Event()      # the marked chunk was swallowed
        self.running = threading.Event()   # set: forwarding; clear: stalled
        self.running.set()
        self.closed = threading.Event()
        self.mute = threading.Event()      # lose_answers: nothing goes back to the client


class Proxy:
    def __init__(self, upstream_host: str, upstream_port: int, *,
                 listen_host: str = "127.0.0.1"):
        self.upstream = (upstream_host, upstream_port)
        self.listener = socket.create_server((listen_host, 0))
        self.listener.settimeout(_TICK)
        self.address = self.listener.getsockname()[:2]
        self.port = self.address[1]
        self.frozen = threading.Event()  # every connection held (freeze)
        self.answers_only = False  # while frozen: only the server's answers are held
        self.pairs: list[_Pair] = []
        self.lock = threading.Lock()
        self.answer_marker: bytes | None = None  # lose_answers
        self.answers_to_lose = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._accept, name="proxy-accept", daemon=True)
        self.thread.start()

    # Faults ----------------------------------------------------------------------

    def pair(self, upstream_port: int) -> _Pair | None:
        with self.lock:
            return next((p for p in self.pairs if p.upstream_port == upstream_port), None)

    def lose_next(self, upstream_port: int, marker: bytes = b"COMMIT") -> _Pair | None:
        pair = self.pair(upstream_port)
        if pair is not None:
            pair.lose_marker = marker
        return pair

    def lose_answers(self, marker: bytes, times: int = 1) -> None:
        with self.lock:
            self.answer_marker, self.answers_to_lose = marker, times

    def _loses_answer(self, data: bytes) -> bool:
        with self.lock:
            if self.answers_to_lose < 1 or self.answer_marker not in data:
                return False
            self.answers_to_lose -= 1
            return True

    def stall(self, upstream_port: int) -> bool:
        pair = self.pair(upstream_port)
        if pair is not None:
            pair.running.clear()
        return pair is not None

    def resume(self, upstream_port: int) -> None:
        pair = self.pair(upstream_port)
        if pair is not None:
            pair.running.set()

    def freeze(self, *, answers_only: bool = False) -> None:
        """Stop forwarding on every connection (all stay open); ``answers_only``: the answers."""
        self.answers_only = answers_only
        self.frozen.set()

    def thaw(self) -> None:
        self.frozen.clear()

    def _held(self, pair: _Pair, upward: bool) -> bool:
        """Whether this direction of ``pair`` must not forward now (stalled, or frozen)."""
        if not pair.running.is_set():
            return True
        return self.frozen.is_set() and not (upward and self.answers_only)

    def release_lost(self) -> None:
        """Close the server side of every connection whose COMMIT was lost: its orphan ends."""
        with self.lock:
            pairs = [p for p in self.pairs if p.lost.is_set() and not p.closed.is_set()]
        for pair in pairs:
            pair.closed.set()
            try:
                pair.server.close()
            except OSError:
                pass

    # Forwarding ------------------------------------------------------------------

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                client, _ = self.listener.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            for sock in (client, server):
                sock.settimeout(_TICK)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pair = _Pair(client, server)
            with self.lock:
                self.pairs.append(pair)
            for source, sink, upward in ((client, server, True), (server, client, False)):
                threading.Thread(target=self._forward, args=(pair, source, sink, upward),
                                 name="proxy-forward", daemon=True).start()

    def _forward(self, pair: _Pair, source: socket.socket, sink: socket.socket,
                 upward: bool) -> None:
        while not (self.stopping.is_set() or pair.closed.is_set()):
            if pair.lost.is_set():
                return  # the server side is kept open and silent until close()
            if self._held(pair, upward):  # stalled or frozen: bounded by _TICK per look
                self.stopping.wait(_TICK)
                continue
            try:
                data = source.recv(65536)
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                data = b""
            if not data:
                self._end(pair)
                return
            if upward and pair.lose_marker is not None and pair.lose_marker in data:
                pair.lost.set()
                self._reset(pair.client)
                return
            if not upward and pair.mute.is_set():
                continue  # lose_answers: swallowed
            while self._held(pair, upward) and not self.stopping.is_set():
                self.stopping.wait(_TICK)  # stalled mid-chunk: hold it
            try:
                sink.sendall(data)
            except OSError:
                self._end(pair)
                return
            if upward and self.answer_marker is not None and self._loses_answer(data):
                # The statement went up (the rest of its messages follow it for a
                # moment); from now on its answers go nowhere, then the line drops.
                pair.mute.set()
                threading.Timer(0.5, self._drop, args=(pair,)).start()

    def _drop(self, pair: _Pair) -> None:
        self._reset(pair.client)
        self._end(pair)

    @staticmethod
    def _reset(sock: socket.socket) -> None:
        try:  # SO_LINGER 0: close() sends a RST, the client's read fails at once
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        try:
            sock.close()
        except OSError:
            pass

    def _end(self, pair: _Pair) -> None:
        if pair.lost.is_set():
            return  # the orphan's server side stays open until close()
        pair.closed.set()
        for sock in (pair.client, pair.server):
            try:
                sock.close()
            except OSError:
                pass

    def close(self) -> None:
        """Stop accepting; close every connection (an orphan's server side too)."""
        self.stopping.set()
        try:
            self.listener.close()
        except OSError:
            pass
        with self.lock:
            pairs = list(self.pairs)
        for pair in pairs:
            pair.closed.set()
            pair.running.set()
            for sock in (pair.client, pair.server):
                try:
                    sock.close()
                except OSError:
                    pass

    def __enter__(self) -> "Proxy":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

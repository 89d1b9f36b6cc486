"""A loopback TCP proxy a test can cut: how a worker is partitioned from one server only.

Point one process at ``proxy.port`` instead of the server's port; ``cut()`` then holds every
byte in both directions — nothing is forwarded, nothing is refused, no connection is closed —
which is what a network that drops packets does to TCP: the sender's writes queue up, its
reads wait, and whatever was held is delivered once the partition heals (``heal()``). That
delayed delivery is the dangerous part of a real partition, and the one fencing must survive.
New connections made during a cut are accepted and then hang too.

``down()`` is the other failure: the server gone (stopped, restarting, a host that refuses).
Every connection through the proxy is closed at once and new ones are closed as soon as they
are accepted, until ``heal()``; the client's next statement or connect fails fast instead
of hanging.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from tests.support.processes import free_port


class Proxy:
    def __init__(self, target_port: int, *, host: str = "127.0.0.1") -> None:
        self.target = (host, target_port)
        self.port = free_port()
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._down = threading.Event()
        self.holding = threading.Event()  # set once a connection or a byte waited at a cut
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()  # ``_sockets``, against a connection made as it closes
        self._listener = socket.create_server((host, self.port), backlog=128)
        self._accepter = threading.Thread(target=self._accept, daemon=True)
        self._accepter.start()

    def url(self, template: str) -> str:
        """``template`` with ``{port}`` replaced by the proxy's port."""
        return template.format(port=self.port)

    def cut(self) -> None:
        self._flowing.clear()

    def heal(self) -> None:
        self._down.clear()
        self._flowing.set()

    def down(self) -> None:
        self._down.set()
        self._close_all()

    def close(self) -> None:
        self._closed.set()
        self._flowing.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._close_all()

    def _close_all(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        self._hold()
        if self._down.is_set():
            client.close()
            return
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        with self._lock:  # a proxy closed or put down meanwhile keeps no connection
            kept = not (self._closed.is_set() or self._down.is_set())
            if kept:
                self._sockets += [client, upstream]
        if not kept:
            client.close()
            upstream.close()
            return
        for source, sink in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _hold(self) -> None:
        if not self._flowing.is_set():
            self.holding.set()
        while not self._flowing.wait(0.05):
            if self._closed.is_set():
                return

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                self._hold()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


@contextmanager
def proxy_to(port: int) -> Iterator[Proxy]:
    proxy = Proxy(port)
    try:
        yield proxy
    finally:
        proxy.close()

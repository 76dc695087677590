"""A loopback TCP listener on a thread, for a host that must (or must not) be reached.

:class:`Listener` accepts each connection, counts it and closes it at once; a subclass gives a
connection another end by overriding :meth:`Listener.handle` (``tests/upstream/test_upstream.py``
reads the whole request first). ``url`` is the listener as an API base (``http://…/v1``).
"""

from __future__ import annotations

import select
import socket
import threading


class Listener:
    """A loopback socket that counts the connections made to it (``connections``) and hands
    each to :meth:`handle`, which closes it at once."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = int(self.sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="loopback-listener", daemon=True)

    def handle(self, conn: socket.socket) -> None:
        """What happens to an accepted connection: here, it is closed."""
        conn.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self.sock], [], [], 0.05)
            if not ready:
                continue
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            self.handle(conn)

    def __enter__(self) -> Listener:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()

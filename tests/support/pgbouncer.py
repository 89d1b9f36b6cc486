"""A PgBouncer of our own in front of the tests' PostgreSQL, in transaction mode (the mode
that hands each transaction to whichever server session is free), on a free port: what many
deployments put between their processes and PostgreSQL.

Every database name goes through to the server under the tests' own role, so a test's fresh
database is reachable at ``url_of(database_url)``. Runs as ``postgres`` when we are root
(PgBouncer refuses to run as root)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy.engine import make_url

from tests.support.processes import free_port, wait_listening


class PgBouncer:
    def __init__(self, server_url: str, *, server_sessions: int, extra: str = "") -> None:
        binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        if not Path(binary).exists():
            raise RuntimeError("pgbouncer is not installed (scripts/ensure-services pgbouncer)")
        self.binary = binary
        self.port = free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="tj-pgbouncer-"))
        server = make_url(server_url)
        login = f"user={server.username}" + (
            f" password={server.password}" if server.password else ""
        )
        (self.directory / "users.txt").write_text(f'"{server.username}" ""\n')
        self.config = self.directory / "pgbouncer.ini"
        self.config.write_text(
            "[databases]\n"
            f"* = host={server.host} port={server.port or 5432} {login}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = any\nauth_file = {self.directory / 'users.txt'}\n"
            f"pool_mode = transaction\ndefault_pool_size = {server_sessions}\n"
            "max_client_conn = 2000\n"
            f"logfile = {self.directory / 'pgbouncer.log'}\n{extra}"
        )
        if os.geteuid() == 0:
            shutil.chown(self.directory, "postgres", "postgres")
            for path in self.directory.iterdir():
                shutil.chown(path, "postgres", "postgres")
        self.process: subprocess.Popen[bytes] | None = None

    def url_of(self, database_url: str) -> str:
        """``database_url`` (a database of the tests' server) reached through this pooler."""
        return (
            make_url(database_url)
            .set(host="127.0.0.1", port=self.port)
            .render_as_string(hide_password=False)
        )

    def start(self) -> None:
        root = ["-u", "postgres"] if os.geteuid() == 0 else []
        command = [self.binary, *root, str(self.config)]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_listening(self.process, self.port, "pgbouncer", self.log)

    def log(self) -> str:
        path = self.directory / "pgbouncer.log"
        return path.read_text() if path.exists() else ""

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()  # its own shutdown takes a second or more
            self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


@contextmanager
def pgbouncer(server_url: str, *, server_sessions: int = 4, extra: str = "") -> Iterator[PgBouncer]:
    """A running PgBouncer in transaction mode in front of ``server_url``'s server, with
    ``server_sessions`` server sessions per database (``extra``: more ``[pgbouncer]`` lines)."""
    bouncer = PgBouncer(server_url, server_sessions=server_sessions, extra=extra)
    bouncer.start()
    try:
        yield bouncer
    finally:
        bouncer.close()

"""Real worker processes (``think-jobs worker`` subprocesses) and a private Redis server."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from tests.support.builders import PATIENCE_S  # a loaded CI box starts a worker slowly too

ROOT = Path(__file__).resolve().parents[2]


class ManagedProcess:
    """A subprocess in its own session whose output is collected (for failure reports);
    ``ready`` is set when a line containing ``ready_marker`` appears."""

    def __init__(self, command: list[str], env: dict[str, str], *, ready_marker: str) -> None:
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.output: list[str] = []
        self.ready = threading.Event()
        self._marker = ready_marker
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)
            if self._marker and self._marker in line:
                self.ready.set()

    def lines(self, needle: str) -> list[str]:
        return [line for line in list(self.output) if needle in line]

    def wait_ready(self, timeout_s: float = PATIENCE_S) -> None:
        if not self.ready.wait(timeout_s):
            self.kill()
            raise RuntimeError("process did not start:\n" + "".join(self.output[-40:]))

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        self._close_output()

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_output()

    def _close_output(self) -> None:
        """Close the pipe once the reader has seen its end (the whole session is gone)."""
        self._reader.join(5)
        if not self._reader.is_alive() and self.process.stdout is not None:
            self.process.stdout.close()


def think_jobs_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "think_jobs.cli", *args]


class WorkerProcess(ManagedProcess):
    """One ``think-jobs worker`` subprocess (ready when Celery logs `` ready.`` at INFO)."""

    def __init__(
        self,
        env: dict[str, str],
        *,
        app: str,
        concurrency: int,
        pool: str,
        log_level: str = "INFO",
        name: str = "w",
        ready_marker: str = " ready.",
    ) -> None:
        command = think_jobs_command(
            "worker", "--app", app, "-c", str(concurrency), "-P", pool, "-l", log_level,
            "-n", f"{name}-{uuid.uuid4().hex[:8]}@%h",
            "--without-mingle", "--without-gossip", "--without-heartbeat",
        )  # fmt: skip
        super().__init__(command, env, ready_marker=ready_marker)


@contextmanager
def worker_processes(
    env: dict[str, str],
    *,
    count: int = 2,
    concurrency: int = 2,
    pool: str = "threads",
    app: str = "tests.apps.agents:jobs",
) -> Iterator[list[WorkerProcess]]:
    workers = [
        WorkerProcess(env, app=app, concurrency=concurrency, pool=pool) for _ in range(count)
    ]
    try:
        for process in workers:
            process.wait_ready()
        yield workers
    except BaseException:
        _report(workers)  # what each worker said, in the failing test's report
        raise
    finally:
        for process in workers:
            process.stop()


def _report(workers: list[WorkerProcess], lines: int = 60) -> None:
    for process in workers:
        pid = process.process.pid
        tail = "".join(process.output[-lines:])
        sys.stderr.write(f"--- worker {pid} (exit {process.process.poll()}), last lines:\n{tail}")


def connections_to(port: int) -> int:
    """How many TCP connections this process has open to ``port`` (read from /proc: the
    sockets among its file descriptors whose remote end is that port)."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        with suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                mine.add(target[len("socket:[") : -1])
    found = 0
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as rows:
            for row in rows.read().splitlines()[1:]:
                fields = row.split()
                remote, state, inode = fields[2], fields[3], fields[9]
                established = state == "01"
                if established and int(remote.rsplit(":", 1)[1], 16) == port and inode in mine:
                    found += 1
    return found


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_listening(
    process: subprocess.Popen[bytes], port: int, what: str, log: Callable[[], str] = str
) -> None:
    """Wait (10 s at most) until ``process`` accepts connections on ``port``; raise, with
    ``log()``, if it exits first or never does."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited at start: {log()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"{what} on port {port} did not start: {log()}")


class PrivateRedis:
    """A redis-server of our own on a free port (so a test may stop and restart it)."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (scripts/ensure-services redis)")
        self.binary = binary
        self.port = free_port()
        self.directory = tempfile.mkdtemp(prefix="tj-redis-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.directory],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_listening(self.process, self.port, "private redis-server")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


class BeatProcess(ManagedProcess):
    """One ``think-jobs beat`` subprocess; ready once it has reconciled the schedules."""

    def __init__(self, env: dict[str, str], *, app: str) -> None:
        command = think_jobs_command("beat", "--app", app, "-l", "INFO")
        super().__init__(command, env, ready_marker="schedules reconciled")

    def fired(self) -> list[str]:
        """``<task> of <agent> for <occurrence>`` for every fire this beat sent."""
        return [line.split("beat: fired ", 1)[1].strip() for line in self.lines("beat: fired ")]


@contextmanager
def beat_processes(env: dict[str, str], count: int = 1, *, app: str) -> Iterator[list[BeatProcess]]:
    beats = [BeatProcess(env, app=app) for _ in range(count)]
    try:
        for beat in beats:
            if not beat.ready.wait(30):
                raise RuntimeError("beat did not start:\n" + "".join(beat.output[-40:]))
        yield beats
    finally:
        for beat in beats:
            beat.stop()


@contextmanager
def private_redis() -> Iterator[PrivateRedis]:
    server = PrivateRedis()
    server.start()
    try:
        yield server
    finally:
        server.close()


class PrivatePostgres:
    """A PostgreSQL cluster of our own (initdb in a temp dir, a free port), so a test may stop
    and restart it without disturbing anyone else. Runs as the ``postgres`` user when we are
    root (PostgreSQL refuses to run as root)."""

    def __init__(self) -> None:
        versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
        if not versions:
            raise RuntimeError("PostgreSQL server binaries not found (scripts/ensure-services)")
        self.bin = versions[-1].parent
        self.port = free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="tj-pg-"))
        self.data = self.directory / "data"
        if os.geteuid() == 0:
            shutil.chown(self.directory, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self.bin / tool), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, cwd=self.directory)

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        options = f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = str(self.directory / "server.log")
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", log, "-o", options, "-w", "-t", "30", "start"
        )

    def stop(self) -> None:
        """An abrupt stop: connections drop at once, as when the server dies."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def close(self) -> None:
        with suppress(subprocess.CalledProcessError):
            self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


@contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    server = PrivatePostgres()
    server.start()
    try:
        yield server
    finally:
        server.close()

"""DBOS Transact as a peer: a partitioned queue (one partition per key, partition concurrency
1, so at most one workflow of a key runs at a time, dequeued in enqueue order), polled every
10 ms by every worker process; the producer enqueues with ``DBOSClient``.

Run by ``bench.peers`` inside ``bench/.peers/dbos``:
``python dbos_peer.py driver --db-url ... --redis-url ...``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from typing import Any

from dbos import DBOS, DBOSClient, DBOSConfig, EnqueueOptions
from harness import Options, announce_ready, job_settings, main, run_job

APP = "peers"
VERSION = "peers-1"
QUEUE = "peers"
WORKFLOW = "peer_job"
POLL_S = 0.01


class DbosPeer:
    name: str = "dbos"
    packages: tuple[str, ...] = ("dbos", "sqlalchemy", "psycopg")

    def __init__(self, options: Options) -> None:
        self.options = options
        self.client = DBOSClient(system_database_url=options.db_url, application_name=APP)

    def setup(self) -> None:
        # Launching one DBOS process creates (migrates) the system database.
        done = _launch_for_migration(self.options.db_url)
        if done != 0:
            raise RuntimeError("DBOS migration failed")
        self.client.register_queue(
            QUEUE,
            partition_concurrency=1,
            worker_concurrency=self.options.concurrency,
            polling_interval_sec=POLL_S,
            application_name=APP,
        )

    def enqueue(self, key: str, seq: int, job_id: str) -> None:
        options: EnqueueOptions = {
            "queue_name": QUEUE,
            "workflow_name": WORKFLOW,
            "queue_partition_key": key,
            "app_version": VERSION,
        }
        self.client.enqueue(options, key, seq, job_id)

    def worker_command(self, concurrency: int) -> list[str]:
        return [sys.executable, __file__, "worker", "--concurrency", str(concurrency)]

    def close(self) -> None:
        self.client.destroy()


def _launch_for_migration(db_url: str) -> int:
    env = {**os.environ, "PEER_DB_URL": db_url, "PEER_REDIS_URL": ""}
    return subprocess.run([sys.executable, __file__, "migrate"], env=env, check=False).returncode


def _config(db_url: str) -> DBOSConfig:
    return {
        "name": APP,
        "system_database_url": db_url,
        "executor_id": f"peer-{os.getpid()}",
        "application_version": VERSION,
        "log_level": "WARNING",
    }


def _start(db_url: str) -> None:
    DBOS(config=_config(db_url))

    @DBOS.workflow(name=WORKFLOW)
    def peer_job(key: str, seq: int, job_id: str) -> None:
        run_job(*job_settings(), key, seq, job_id)

    DBOS.launch()


def run_worker(concurrency: int) -> None:
    stop = threading.Event()

    def on_term(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    _start(job_settings()[0])
    announce_ready()
    stop.wait()
    DBOS.destroy()


if __name__ == "__main__":
    if sys.argv[1:] == ["migrate"]:
        DBOS(config=_config(os.environ["PEER_DB_URL"]))
        DBOS.launch()
        DBOS.destroy()
        sys.exit(0)
    main(__doc__.splitlines()[0], DbosPeer, run_worker)

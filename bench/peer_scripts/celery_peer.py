"""Celery 5.x as a peer: a plain Celery app (Redis broker, threads pool) whose task writes the
same result row; no ordering or exclusion per key (nothing in Celery provides it).

Run by ``bench.peers`` inside ``bench/.peers/celery``:
``python celery_peer.py driver --db-url ... --redis-url ...``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from celery import Celery, signals
from harness import Options, announce_ready, job_settings, main, run_job

QUEUE = "peers"
TASK = "peer_job"


def build_app(redis_url: str) -> Celery:
    app = Celery("peers", broker=redis_url, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )

    @app.task(name=TASK, ignore_result=True)  # type: ignore[untyped-decorator]
    def peer_job(key: str, seq: int, job_id: str) -> None:
        run_job(*job_settings(), key, seq, job_id)

    return app


class CeleryPeer:
    name: str = "celery"
    packages: tuple[str, ...] = ("celery", "kombu", "redis", "psycopg")

    def __init__(self, options: Options) -> None:
        self.app = build_app(options.redis_url)
        self.task = self.app.tasks[TASK]

    def setup(self) -> None:
        return None

    def enqueue(self, key: str, seq: int, job_id: str) -> None:
        self.task.apply_async(kwargs={"key": key, "seq": seq, "job_id": job_id}, queue=QUEUE)

    def worker_command(self, concurrency: int) -> list[str]:
        return [sys.executable, __file__, "worker", "--concurrency", str(concurrency)]

    def close(self) -> None:
        self.app.close()


def _on_ready(sender: Any = None, **_: Any) -> None:
    announce_ready()


def run_worker(concurrency: int) -> None:
    app = build_app(job_settings()[1])
    signals.worker_ready.connect(_on_ready, weak=False)
    app.worker_main(
        [
            "worker",
            "-Q", QUEUE, "-P", "threads", "-c", str(concurrency), "-l", "WARNING",
            "-n", f"peer-{os.getpid()}@%h",
            "--without-mingle", "--without-gossip", "--without-heartbeat",
        ]
    )  # fmt: skip


if __name__ == "__main__":
    main(__doc__.splitlines()[0], CeleryPeer, run_worker)

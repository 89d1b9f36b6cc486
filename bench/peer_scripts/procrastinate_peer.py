"""procrastinate 3.x as a peer: one task, deferred with ``lock=<key>`` (jobs sharing a lock
run one at a time, in id order), workers listening with LISTEN/NOTIFY.

Run by ``bench.peers`` inside ``bench/.peers/procrastinate``:
``python procrastinate_peer.py driver --db-url ... --redis-url ...``.
"""

from __future__ import annotations

import sys

import procrastinate
from harness import Options, announce_ready, job_settings, main, run_job

QUEUE = "peers"
TASK = "peer_job"


def build_app(db_url: str) -> procrastinate.App:
    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(conninfo=db_url, min_size=1, max_size=4)
    )

    @app.task(name=TASK, queue=QUEUE)
    def peer_job(key: str, seq: int, job_id: str) -> None:
        run_job(*job_settings(), key, seq, job_id)

    return app


class ProcrastinatePeer:
    name: str = "procrastinate"
    packages: tuple[str, ...] = ("procrastinate", "psycopg", "psycopg-pool")

    def __init__(self, options: Options) -> None:
        self.options = options
        self.app = build_app(options.db_url)
        self.app.open()
        self.task = self.app.tasks[TASK]

    def setup(self) -> None:
        self.app.schema_manager.apply_schema()

    def enqueue(self, key: str, seq: int, job_id: str) -> None:
        self.task.configure(lock=key).defer(key=key, seq=seq, job_id=job_id)

    def worker_command(self, concurrency: int) -> list[str]:
        return [sys.executable, __file__, "worker", "--concurrency", str(concurrency)]

    def close(self) -> None:
        self.app.close()


def run_worker(concurrency: int) -> None:
    app = build_app(job_settings()[0])
    announce_ready()
    app.run_worker(queues=[QUEUE], concurrency=concurrency, wait=True)


if __name__ == "__main__":
    main(__doc__.splitlines()[0], ProcrastinatePeer, run_worker)

"""Celery task messages as kombu's Redis transport stores them, built without Celery.

A drain is the one message think-jobs sends on every admission and release, so when the broker
is a plain ``redis://`` server (``is_plain_redis``) ``transport.dispatch`` builds it here and
LPUSHes it to the queue's list, as kombu's ``Channel._put`` does: the same protocol-2 message
``send_task(name, args, queue=queue, ignore_result=True)`` writes (a test compares the two),
without the producer pool, the exchange declaration, the entity copies and the retry wrappers
of a Celery send, which cost more CPU than the database statement of an admission. Celery's
``before_task_publish``/``after_task_publish`` signals do not fire for these messages. This
module imports neither Celery nor kombu (``import think_jobs`` stays light).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import uuid
from typing import Any, Final
from urllib.parse import urlsplit

_EMBED: Final = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


def task_message(
    name: str, args: list[Any], kwargs: dict[str, Any], *, queue: str, reply_to: str
) -> str:
    """The JSON kombu's Redis transport stores in ``queue``'s list for a Celery task ``name``
    called with ``args`` and ``kwargs`` (protocol 2, JSON, results ignored, default
    priority)."""
    task_id = str(uuid.uuid4())
    body = json.dumps([args, kwargs, _EMBED]).encode()
    headers: dict[str, Any] = {
        "lang": "py",
        "task": name,
        "id": task_id,
        "shadow": None,
        "eta": None,
        "expires": None,
        "group": None,
        "group_index": None,
        "retries": 0,
        "timelimit": [None, None],
        "root_id": task_id,
        "parent_id": None,
        "argsrepr": repr(args),
        "kwargsrepr": repr(kwargs),
        "origin": f"gen{os.getpid()}@{_HOST}",
        "ignore_result": True,
        "replaced_task_nesting": 0,
        "stamped_headers": None,
        "stamps": {},
    }
    properties: dict[str, Any] = {
        "correlation_id": task_id,
        "reply_to": reply_to,
        "delivery_mode": 2,
        "delivery_info": {"exchange": "", "routing_key": queue},
        "priority": 0,
        "body_encoding": "base64",
        "delivery_tag": str(uuid.uuid4()),
    }
    message = {
        "body": base64.b64encode(body).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": headers,
        "properties": properties,
    }
    return json.dumps(message)


_HOST: Final = socket.gethostname()


def is_plain_redis(broker_url: str) -> bool:
    """A ``redis://`` URL (not TLS, Sentinel or another broker)."""
    return urlsplit(broker_url).scheme == "redis"

"""Put on the PYTHONPATH of a process run under libfaketime (``fencing_faults.skewed``).

libfaketime 0.9.10 (Debian 12) with ``FAKETIME_DONT_FAKE_MONOTONIC=1`` fails CPython's
``time.sleep`` with ``OSError: [Errno 22] Invalid argument``: CPython sleeps with
``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, ...)`` and libfaketime's wrapper mistranslates
the absolute monotonic deadline. Celery beat's loop sleeps that way and died at its first
tick. Waiting in ``select`` instead is the same wait on the same monotonic time; the faked
wall clock, which is what the fault is about, is left as it is."""

from __future__ import annotations

import select
import time
from typing import SupportsIndex


def _sleep(seconds: float | SupportsIndex) -> None:
    deadline = time.monotonic() + float(seconds)
    while (left := deadline - time.monotonic()) > 0:
        select.select([], [], [], left)


time.sleep = _sleep

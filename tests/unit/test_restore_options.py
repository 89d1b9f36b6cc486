"""kombu's redelivery of unacknowledged messages, sized from the visibility timeout
(``celery_redis.restore_options``); that a killed worker's message really comes back within
seconds of a shortened timeout is tested with real workers in
``tests/integration/test_workflows.py``."""

from __future__ import annotations

from think_jobs import ThinkJobs
from think_jobs.settings import Settings
from think_jobs.transport.celery_redis import restore_options


def test_the_default_timeout_keeps_kombus_scans_and_lock() -> None:
    assert restore_options(21_600) == {"visibility_timeout": 21_600, "unacked_mutex_expire": 300}


def test_a_shortened_timeout_scans_at_a_tenth_of_it_and_its_lock_lasts_no_longer() -> None:
    assert restore_options(120) == {
        "visibility_timeout": 120,
        "unacked_mutex_expire": 120,
        "unacked_restore_interval": 12,
        "unacked_restore_throttle": 1,
    }


def test_a_timeout_of_seconds_scans_every_second_with_a_whole_second_lock() -> None:
    options = restore_options(2.5)
    assert options["unacked_mutex_expire"] == 3  # Redis takes whole seconds
    assert options["unacked_restore_interval"] == 1
    assert options["unacked_restore_throttle"] == 1


def test_the_app_passes_them_to_kombu_with_the_setting() -> None:
    jobs = ThinkJobs(Settings(broker_visibility_timeout_s=60))
    try:
        options = jobs.celery.conf.broker_transport_options
    finally:
        jobs.close()
    assert options | restore_options(60) == options

"""Structured logs, and the one switch that sets them up in every process.

Every state transition is logged once with ``agent``, ``agent_type``, ``agent_name``,
``submission_id``, ``request_id``, ``attempt``, ``trigger`` (and ``status``/``duration_s`` at the
end) as ``extra`` fields. ``configure(settings)`` applies ``THINK_JOBS_LOG_LEVEL`` to the
``think_jobs`` and ``web`` loggers and, with ``THINK_JOBS_LOG_JSON=true``, ``JsonFormatter`` (one
JSON object per line) to the root handlers. think-jobs' own processes call it (worker, beat,
``web.create_app``, the CLI); a script of yours calls it once at start-up. Message content
never appears unless ``log_content`` is on.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from think_jobs.errors import ConfigurationError

if TYPE_CHECKING:
    from think_jobs.settings import Settings

LOGGERS = ("think_jobs", "web")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
_STANDARD |= {"taskName"}  # Python 3.12+ adds it to every record


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, extra fields, exception."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(
    settings: Settings, *, level: int | str | None = None, root: logging.Logger | None = None
) -> None:
    """Set the level of think-jobs' loggers and, if ``log_json``, the JSON format.

    ``level`` (e.g. a worker's ``-l``) wins over ``settings.log_level``. ``root`` is the logger
    whose handlers format the records (default: the root logger; it gets a stderr handler when
    it has none, so records are written at all). Calling it again changes nothing more.
    """
    target = root or logging.getLogger()
    if not target.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(PLAIN_FORMAT))
        target.addHandler(handler)
    number = level_number(settings.log_level if level is None else level)
    for name in LOGGERS:
        logging.getLogger(name).setLevel(number)
    if settings.log_json:
        use_json(target)


def level_number(level: int | str) -> int:
    """``"info"`` → 20; an unknown name is a ``ConfigurationError`` naming the choices."""
    if isinstance(level, int):
        return level
    name = level.strip().upper()
    if name not in LEVELS:
        raise ConfigurationError(f"unknown log level {level!r}; use one of {', '.join(LEVELS)}")
    return int(logging.getLevelName(name))


def use_json(logger: logging.Logger | None = None) -> None:
    """Give every handler of ``logger`` (default: the root logger) the JSON formatter."""
    target = logger or logging.getLogger()
    if not target.handlers:
        target.addHandler(logging.StreamHandler())
    for handler in target.handlers:
        handler.setFormatter(JsonFormatter())

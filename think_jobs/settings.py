"""Settings: defaults, then ``THINK_JOBS_*`` environment variables, then keyword overrides.

A misspelled key is an error both as a keyword and as an environment variable, so a typo in a
deployment never silently falls back to a default.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from think_jobs.errors import ConfigurationError

ENV_PREFIX = "THINK_JOBS_"
# Environment variables with our prefix that are read by the CLI, not by Settings.
_NON_SETTING_ENV = frozenset({"THINK_JOBS_APP"})

TokenList = Annotated[tuple[SecretStr, ...], NoDecode]


class Settings(BaseSettings):
    """Every knob of think-jobs. Durations carry their unit in the name."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="forbid")

    database_url: str = "sqlite:///think_jobs.db"
    redis_url: str = "redis://localhost:6379/0"
    broker_url: str | None = None
    queue: str = "think_jobs"
    key_prefix: str = "think"

    lease_ttl_s: float = Field(30.0, gt=0)
    sweep_interval_s: float = Field(5.0, gt=0)
    drain_slice_s: float = Field(0.1, ge=0)
    cancel_poll_interval_s: float = Field(0.2, gt=0)
    caller_poll_interval_s: float = Field(0.5, gt=0)
    recovery_max_attempts: int = Field(10, ge=1)
    stream_ttl_s: int = Field(86_400, ge=1)
    revocation_ttl_s: int = Field(86_400, ge=1)
    broker_publish_timeout_s: float = Field(2.0, gt=0)

    max_messages_per_submission: int = Field(100, ge=1)
    max_metadata_bytes: int = Field(16_384, ge=2)
    max_steps: int = Field(10, ge=1)
    db_pool_size: int = Field(7, ge=1)

    api_tokens: TokenList = ()
    read_tokens: TokenList = ()
    webhook_secret: SecretStr | None = None
    webhook_delivery_header: str = "X-Delivery-Id"
    secret_key: SecretStr | None = None
    auth_disabled: bool = False
    max_request_bytes: int = Field(1_048_576, ge=1024)

    beat_tick_interval_s: float = Field(5.0, gt=0)
    schedule_retry_backoff_s: float = Field(5.0, gt=0)
    broker_visibility_timeout_s: float = Field(21_600, gt=0)
    result_backend_url: str | None = None

    celery_task_events: bool = True
    log_json: bool = False
    log_content: bool = False

    @field_validator("api_tokens", "read_tokens", mode="before")
    @classmethod
    def _split_tokens(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(token.strip() for token in value.split(",") if token.strip())
        return value

    @property
    def effective_broker_url(self) -> str:
        return self.broker_url or self.redis_url

    @property
    def heartbeat_interval_s(self) -> float:
        return self.lease_ttl_s / 3


def _check_environment(environ: Mapping[str, str]) -> None:
    known = {ENV_PREFIX + name.upper() for name in Settings.model_fields}
    for key in environ:
        if key.startswith(ENV_PREFIX) and key not in known and key not in _NON_SETTING_ENV:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ConfigurationError(f"Unknown setting {key}{hint}")


def load_settings(**overrides: Any) -> Settings:
    """Build Settings from the environment and ``overrides``; raise ConfigurationError on typos."""
    _check_environment(os.environ)
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigurationError(f"Invalid think-jobs settings: {exc}") from exc

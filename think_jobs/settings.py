"""Settings: defaults, then ``THINK_JOBS_*`` environment variables, then keyword overrides.

A misspelled key is an error both as a keyword and as an environment variable, so a typo in a
deployment never silently falls back to a default.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from think_jobs.errors import ConfigurationError

ENV_PREFIX = "THINK_JOBS_"
# Environment variables with our prefix that are read by the CLI, not by Settings.
SECRETS_DIR_VARIABLE = "THINK_JOBS_SECRETS_DIR"
_NON_SETTING_ENV = frozenset({"THINK_JOBS_APP", SECRETS_DIR_VARIABLE})

TokenList = Annotated[tuple[SecretStr, ...], NoDecode]


class Settings(BaseSettings):
    """Every knob of think-jobs. Durations carry their unit in the name."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="forbid")

    database_url: str = Field(
        "sqlite:///think_jobs.db",
        description="SQLAlchemy URL of the database that holds every turn (PostgreSQL: "
        "`postgresql+psycopg://...` with the `postgres` extra).",
    )
    redis_url: str = Field(
        "redis://localhost:6379/0",
        description="Redis for streams, revocation flags, wake-ups and worker presence.",
    )
    broker_url: str | None = Field(None, description="Celery broker URL; unset: `redis_url`.")
    queue: str = Field("think_jobs", description="Celery queue the drains go to.")
    key_prefix: str = Field(
        "think", description="Prefix of every Redis key (see `think_jobs/keys.py`)."
    )

    lease_ttl_s: float = Field(
        30.0, gt=0, description="How long a silent executor keeps an agent's lease."
    )
    sweep_interval_s: float = Field(
        5.0, gt=0, description="How often workers look for agents that need a nudge."
    )
    drain_slice_s: float = Field(
        0.1,
        ge=0,
        description="How long one drain task keeps running the same agent's turns before "
        "it hands on (0: one turn per task).",
    )
    cancel_poll_interval_s: float = Field(
        0.2,
        gt=0,
        description="How often a running turn checks its revocation flag between chunks.",
    )
    caller_poll_interval_s: float = Field(
        0.5,
        gt=0,
        description="Fallback poll of a waiting blocking caller (wake-ups come by pub/sub).",
    )
    recovery_max_attempts: int = Field(
        10, ge=1, description="Continuation attempts of an interrupted turn."
    )
    stream_ttl_s: int = Field(86_400, ge=1, description="Lifetime of a request's replay buffer.")
    revocation_ttl_s: int = Field(
        86_400, ge=1, description="Lifetime of a request's revocation flag."
    )
    broker_publish_timeout_s: float = Field(
        2.0,
        gt=0,
        description="How long one write of a turn's stream to Redis may take before it is "
        "tried again later (its chunks are kept, never dropped), and how long a turn's end "
        "keeps trying before readers rebuild the end from the database.",
    )
    stream_flush_window_ms: float = Field(
        2.0,
        ge=0,
        le=1000,
        description="Coalescing of a turn's stream writes: a chunk goes out at once unless "
        "the turn wrote less than this long ago; then it is held and written, with whatever "
        "else came meanwhile, in one write when the window ends (by the next chunk or the "
        "process's flusher thread), so a chunk waits at most this long (plus a thread "
        "wake-up) before its write. 0: every chunk is written at once.",
    )
    redis_stream_connections: int | None = Field(
        None,
        ge=1,
        description="Redis connections a process writes turns' streams with. A running turn "
        "holds one; once all but a few are held, further turns share those few a command at "
        "a time, each write waiting up to `broker_publish_timeout_s` (chunks come late, never "
        "lost). Unset: a worker's concurrency + 8, at least 100.",
    )

    max_messages_per_submission: int = Field(
        100, ge=1, description="Most messages one submission may carry."
    )
    max_metadata_bytes: int = Field(
        16_384, ge=2, description="Largest submission metadata, as JSON bytes."
    )
    max_json_depth: int = Field(
        64,
        ge=1,
        le=128,
        description="How deep a JSON value may nest: a part's data, tool input and output, "
        "provider metadata, message and submission metadata, a turn's body. At most 128, so "
        "that what is stored reads back (pydantic's JSON reader stops at 200 levels).",
    )
    max_message_bytes: int = Field(
        4_194_304,
        ge=1024,
        description="Largest message, input or reply, as compact UTF-8 JSON (4 MiB).",
    )
    max_submission_bytes: int = Field(
        16_777_216,
        ge=1024,
        description="Largest sum of the messages of one submission, as JSON (16 MiB).",
    )
    max_parts_per_message: int = Field(
        1000, ge=1, description="Most parts one message, input or reply, may hold."
    )
    max_steps: int = Field(
        10,
        ge=1,
        description="Tool-loop steps per turn (an agent class's `max_steps` overrides it).",
    )
    approval_timeout_s: float | None = Field(
        None,
        gt=0,
        description="A tool approval left open this long expires: the call is denied with a "
        "reason and the model goes on (the sweeper checks). Unset: approvals wait forever.",
    )
    db_pool_size: int = Field(
        7,
        ge=1,
        description="SQLAlchemy pool size (as many again may overflow): the worker's "
        "concurrency + 2 for short turns. A turn waiting on its model holds no connection, so "
        "a worker of hundreds of slow LLM turns needs no more than the default.",
    )
    db_idle_transaction_timeout_s: float = Field(
        60.0,
        gt=0,
        description="PostgreSQL ends a session of ours left idle inside a transaction this "
        "long (`idle_in_transaction_session_timeout`), rolling it back: a process paused or "
        "cut off between a transaction's statements (SIGSTOP, a partition) cannot hold an "
        "agent's row lock, and with it the agent and every submit to it, for good.",
    )

    db_pooler: Literal["none", "transaction"] = Field(
        "none",
        description="`transaction` when a connection pooler in transaction mode (PgBouncer, "
        "RDS Proxy, Supavisor; right for session mode too) stands between the processes and "
        "PostgreSQL: no `options` at connect (poolers refuse them), no prepared statements (a "
        "pooler hands each transaction to any server session), and "
        "`db_idle_transaction_timeout_s` set by `SET LOCAL` in each write transaction.",
    )

    api_tokens: TokenList = Field(
        (), description="Comma-separated bearer tokens of the web app with read and write scope."
    )
    read_tokens: TokenList = Field(
        (), description="Comma-separated bearer tokens of the web app with read scope only."
    )
    webhook_secret: SecretStr | None = Field(
        None, description="HMAC secret of `/hooks`; unset: the webhook route answers 404."
    )
    webhook_delivery_header: str = Field(
        "X-Delivery-Id",
        description="Webhook header whose value becomes the idempotency key.",
    )
    webhook_scheme: Literal["github", "standard"] = Field(
        "github",
        description="How webhook deliveries are signed: `github` (X-Signature-256 over the "
        "body) or `standard` (Standard Webhooks: webhook-id, webhook-timestamp and "
        "webhook-signature over id.timestamp.body; the delivery id is signed and old "
        "captures are refused).",
    )
    webhook_previous_secrets: TokenList = Field(
        (), description="Comma-separated webhook secrets still accepted while senders rotate."
    )
    webhook_tolerance_s: int = Field(
        300,
        ge=1,
        description="Standard webhooks: how far `webhook-timestamp` may be from now.",
    )
    secret_key: SecretStr | None = Field(
        None, description="Signs the web app's sessions and CSRF tokens (required by the web app)."
    )
    auth_disabled: bool = Field(
        False, description="Serve the web app without authentication (explicit opt-out)."
    )
    max_request_bytes: int = Field(
        1_048_576, ge=1024, description="Largest request body the web app reads."
    )

    admin_session_ttl_s: int = Field(
        43_200,
        ge=60,
        description="An admin login ends this long after its last request (12 h); logging "
        "out ends it at once.",
    )

    beat_tick_interval_s: float = Field(
        5.0, gt=0, description="How often beat looks for due schedules."
    )
    schedule_retry_backoff_s: float = Field(
        5.0,
        gt=0,
        description="First wait before a failed scheduled task is tried again (doubles, "
        "at most 5 minutes).",
    )
    schedule_fire_timeout_s: float = Field(
        300.0,
        gt=0,
        description="How long a claimed occurrence may go unfired before beat sends it again "
        "(a fire lost with a killed process or an emptied Redis); a worker firing one holds "
        "it, renewing every third of this, so handlers may run longer.",
    )
    broker_visibility_timeout_s: float = Field(
        21_600,
        gt=0,
        description="Redis transport visibility timeout (longer than any turn or workflow "
        "step wait); kombu's scans for expired messages and their lock are sized from it.",
    )
    result_backend_url: str | None = Field(
        None,
        description="Celery result backend of workflow steps (chords, `.get()`); unset: "
        "`redis_url`.",
    )

    celery_task_events: bool = Field(
        True, description="Workers send Celery task events (for Flower); about 10 % of CPU."
    )
    worker_handover_s: float | None = Field(
        None,
        ge=0,
        description="How long a worker told to stop (SIGTERM: Celery's warm shutdown) lets its "
        "running turns go on before it hands each one over: the model is stopped, the partial "
        "reply stored and the agent released, and a worker that runs on continues the turn at "
        "once. Unset: wait for the turns to end, as Celery does. Set it below the grace period "
        "of whatever stops workers (Kubernetes 30 s, `docker stop` 10 s): a turn that the kill "
        "ends instead waits for its lease to lapse (`lease_ttl_s`) before it goes on.",
    )
    worker_gc_freeze: bool = Field(
        True,
        description="A worker started from the command line (`think-jobs worker`, `celery "
        "worker`) takes what it holds once ready out of the garbage collector's full scans "
        "(`gc.freeze()`); they then pause every thread ~5 ms here instead of ~90 ms.",
    )
    log_level: str = Field(
        "INFO",
        description="Level of the `think_jobs` and `web` loggers in every think-jobs "
        "process (worker, beat, web, CLI, `ThinkJobs.configure_logging()`).",
    )
    log_json: bool = Field(False, description="Write log records as one JSON object per line.")
    log_content: bool = Field(
        False,
        description="Add a DEBUG `turn reply` record with the reply's text (development only).",
    )
    worker_heartbeat_interval_s: float = Field(
        5.0,
        gt=0,
        description="How often a worker (and beat) rewrites its presence record in Redis; "
        "a record expires after three intervals.",
    )
    session_cookie_secure: bool = Field(
        True,
        description="The web app's session cookie is HTTPS-only; false for plain-HTTP mode "
        "(a trusted network without TLS).",
    )

    @field_validator("api_tokens", "read_tokens", "webhook_previous_secrets", mode="before")
    @classmethod
    def _split_tokens(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(token.strip() for token in value.split(",") if token.strip())
        return value

    @model_validator(mode="after")
    def _pooler_needs_postgresql(self) -> Settings:
        if self.db_pooler != "none" and not self.database_url.startswith("postgresql"):
            raise ValueError(
                "db_pooler (THINK_JOBS_DB_POOLER) is for a pooler in front of PostgreSQL; "
                "leave it `none` with this database_url"
            )
        return self

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
    """Build Settings from the environment and ``overrides``; raise ConfigurationError on typos.

    A setting may also come from a file named ``think_jobs_<name>`` in ``$THINK_JOBS_SECRETS_DIR``
    (Docker secrets: ``/run/secrets``); an environment variable of the same name wins.
    """
    _check_environment(os.environ)
    secrets_dir = os.environ.get(SECRETS_DIR_VARIABLE) or None
    try:
        return Settings(**overrides, _secrets_dir=secrets_dir)
    except ValidationError as exc:
        raise ConfigurationError(f"Invalid think-jobs settings: {exc}") from exc

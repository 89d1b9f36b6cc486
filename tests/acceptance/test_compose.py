"""docker-compose.yml as ``docker compose config`` reads it (Debian's docker-compose; no Docker
engine is needed to validate, and none runs here, so the stack itself is not started)."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

import yaml

from tests.support.processes import ROOT

SECRETS = {"THINK_JOBS_API_TOKENS": "token-1", "THINK_JOBS_SECRET_KEY": "secret-1"}
OURS = ("migrate", "worker", "beat", "web")


def compose_config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("docker-compose")
    if binary is None:
        raise RuntimeError("docker-compose is missing: scripts/ensure-services compose")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("THINK_JOBS_")}
    return subprocess.run(
        [binary, "-f", "docker-compose.yml", "config"],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_stack_validates_and_is_configured_only_through_think_jobs_variables() -> None:
    result = compose_config(SECRETS)
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = yaml.safe_load(result.stdout)
    services = config["services"]
    assert set(services) == {"redis", "postgres", *OURS}
    for name in OURS:
        environment = services[name]["environment"]
        assert all(key.startswith("THINK_JOBS_") for key in environment), name
        assert environment["THINK_JOBS_API_TOKENS"] == "token-1"
        assert services[name]["command"][0] in {"think-jobs", "gunicorn"}
    for name in ("redis", "postgres", "worker", "web"):
        assert services[name]["healthcheck"]["test"], name
    assert services["worker"]["depends_on"]["migrate"]["condition"] == (
        "service_completed_successfully"
    )


def test_the_stack_refuses_to_start_without_its_secrets() -> None:
    result = compose_config({"THINK_JOBS_SECRET_KEY": "secret-1"})
    assert result.returncode != 0
    assert "set THINK_JOBS_API_TOKENS" in result.stderr

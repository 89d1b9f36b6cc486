"""docker-compose.yml as ``docker compose config`` (v2) reads it. No Docker engine is needed to
validate, and none runs here, so the stack itself is not started."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from typing import Any

import pytest

from tests.support.processes import ROOT
from think_jobs.settings import ENV_PREFIX, Settings

PASSWORD = {"POSTGRES_PASSWORD": "pw-123"}
OURS = ("migrate", "worker", "beat", "web")
LONG_RUNNING = ("redis", "postgres", "worker", "beat", "web")
NOT_SETTINGS = {"THINK_JOBS_APP", "THINK_JOBS_SECRETS_DIR"}


def compose_config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    if shutil.which("docker") is None:
        raise RuntimeError("docker (the CLI) is missing: scripts/ensure-services compose")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("THINK_JOBS_", "POSTGRES_"))}
    return subprocess.run(
        ["docker", "compose", "-f", "docker-compose.yml", "config", "--format", "json"],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    result = compose_config(PASSWORD)  # no web secrets: they are read when web starts
    assert result.returncode == 0, result.stderr
    found: dict[str, Any] = json.loads(result.stdout)["services"]
    return found


def test_it_is_docker_compose_v2() -> None:
    version = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
    assert version.returncode == 0 and "version v2." in version.stdout, version.stderr


def test_the_services_and_their_health_checks(services: dict[str, Any]) -> None:
    assert set(services) == {"redis", "postgres", *OURS}
    for name in LONG_RUNNING:
        assert services[name]["healthcheck"]["test"], name
    assert "think-jobs workers --check beat@$$HOSTNAME" in services["beat"]["healthcheck"]["test"]
    for name in ("worker", "beat", "web"):
        assert services[name]["depends_on"]["migrate"]["condition"] == (
            "service_completed_successfully"
        )


def test_migrate_needs_only_the_database(services: dict[str, Any]) -> None:
    assert set(services["migrate"]["environment"]) == {"THINK_JOBS_DATABASE_URL"}
    assert "secrets" not in services["migrate"]


def test_every_variable_is_a_real_setting(services: dict[str, Any]) -> None:
    known = {ENV_PREFIX + name.upper() for name in Settings.model_fields} | NOT_SETTINGS
    for name in OURS:
        ours = {key for key in services[name]["environment"] if key.startswith(ENV_PREFIX)}
        assert ours <= known, (name, ours - known)
        others = set(services[name]["environment"]) - ours
        assert others <= {"PROMETHEUS_MULTIPROC_DIR"}, (name, others)


def test_credentials_come_from_outside_the_file(services: dict[str, Any]) -> None:
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"] == "pw-123"
    url = services["worker"]["environment"]["THINK_JOBS_DATABASE_URL"]
    assert url == "postgresql+psycopg://think:pw-123@postgres:5432/think"
    text = (ROOT / "docker-compose.yml").read_text()
    assert not re.search(r"PASSWORD:\s*[\"']?\w", text.replace("${POSTGRES_PASSWORD", "")), text
    refused = compose_config({})
    assert refused.returncode != 0 and "set POSTGRES_PASSWORD" in refused.stderr


def test_web_secrets_are_docker_secrets_read_from_the_environment() -> None:
    result = compose_config(PASSWORD)
    config = json.loads(result.stdout)
    assert config["secrets"]["think_jobs_api_tokens"]["environment"] == "THINK_JOBS_API_TOKENS"
    assert config["secrets"]["think_jobs_secret_key"]["environment"] == "THINK_JOBS_SECRET_KEY"
    web = config["services"]["web"]
    assert {s["source"] for s in web["secrets"]} == set(config["secrets"])
    assert web["environment"]["THINK_JOBS_SECRETS_DIR"] == "/run/secrets"


def test_plain_http_mode_is_a_named_setting_of_the_web_service(services: dict[str, Any]) -> None:
    assert services["web"]["environment"]["THINK_JOBS_SESSION_COOKIE_SECURE"] == "false"
    text = (ROOT / "docker-compose.yml").read_text()
    assert "# Plain-HTTP mode." in text
    with_tls = compose_config({**PASSWORD, "THINK_JOBS_SESSION_COOKIE_SECURE": "true"})
    web = json.loads(with_tls.stdout)["services"]["web"]
    assert web["environment"]["THINK_JOBS_SESSION_COOKIE_SECURE"] == "true"


def test_web_runs_gunicorn_with_multiprocess_metrics(services: dict[str, Any]) -> None:
    web = services["web"]
    assert web["command"][:3] == ["gunicorn", "-c", "python:web.gunicorn_conf"]
    assert web["environment"]["PROMETHEUS_MULTIPROC_DIR"]

"""Settings from files in $THINK_JOBS_SECRETS_DIR (Docker secrets), the environment winning;
settings that contradict each other refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from think_jobs.errors import ConfigurationError
from think_jobs.settings import load_settings


def test_a_setting_can_come_from_a_secret_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "think_jobs_secret_key").write_text("from-a-file\n")
    (tmp_path / "think_jobs_api_tokens").write_text("tok-1,tok-2\n")
    monkeypatch.setenv("THINK_JOBS_SECRETS_DIR", str(tmp_path))
    settings = load_settings()
    assert settings.secret_key is not None
    assert settings.secret_key.get_secret_value() == "from-a-file"
    assert [t.get_secret_value() for t in settings.api_tokens] == ["tok-1", "tok-2"]
    monkeypatch.setenv("THINK_JOBS_SECRET_KEY", "from-the-environment")
    winner = load_settings().secret_key
    assert winner is not None and winner.get_secret_value() == "from-the-environment"


def test_a_pooler_setting_with_a_database_it_cannot_front_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("THINK_JOBS_DB_POOLER", "transaction")
    with pytest.raises(ConfigurationError, match="leave it `none` with this database_url"):
        load_settings(database_url="sqlite:///think_jobs.db")
    pooled = load_settings(database_url="postgresql+psycopg://u@pooler:6432/db")
    assert pooled.db_pooler == "transaction"
    with pytest.raises(ConfigurationError, match="db_pooler"):
        load_settings(database_url="postgresql+psycopg://u@pooler:6432/db", db_pooler="session")

"""Settings from files in $THINK_JOBS_SECRETS_DIR (Docker secrets), the environment winning."""

from __future__ import annotations

from pathlib import Path

import pytest

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

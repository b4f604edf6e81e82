"""Settings: defaults, env parsing, clear errors, and docs that match the code."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from core.settings import Settings, configure_environment

REPO = Path(__file__).resolve().parents[2]


def test_defaults_and_derived_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KBFLOW_HOME", str(tmp_path / "h"))
    monkeypatch.delenv("KBFLOW_DATABASE_URL", raising=False)  # set in the PostgreSQL pass
    s = Settings()
    assert s.home == tmp_path / "h"
    assert s.registry_url == f"sqlite:///{(tmp_path / 'h' / 'registry.db').resolve()}"
    assert s.vectors_dir == tmp_path / "h" / "vectors"
    assert s.qdrant_url is None


def test_env_values_are_parsed_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KBFLOW_TOP_SECRET_UNKNOWN", "ignored")
    monkeypatch.setenv("KBFLOW_EMBED_BATCH_SIZE", "16")
    assert Settings().embed_batch_size == 16
    monkeypatch.setenv("KBFLOW_EMBED_BATCH_SIZE", "0")
    with pytest.raises(ValidationError, match="embed_batch_size"):
        Settings()


def test_overlap_must_stay_below_the_cap() -> None:
    with pytest.raises(ValidationError, match="chunk_overlap_words must be smaller"):
        Settings(chunk_max_words=50, chunk_overlap_words=50)


def test_configure_environment_keeps_state_under_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("PREFECT_HOME", "DO_NOT_TRACK", "DLT_DATA_DIR"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "true")  # the user's choice wins
    configure_environment(Settings(home=tmp_path / "h"))
    assert os.environ["PREFECT_HOME"] == str((tmp_path / "h" / "prefect").resolve())
    assert os.environ["DO_NOT_TRACK"] == "1"
    assert os.environ["DLT_DATA_DIR"].startswith(str(tmp_path.resolve()))
    assert os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] == "true"


def test_readme_and_env_example_document_every_setting() -> None:
    readme = (REPO / "README.md").read_text()
    example = (REPO / ".env.example").read_text()
    for name in Settings.model_fields:
        var = f"KBFLOW_{name.upper()}"
        assert f"`{var}`" in readme, f"{var} missing from the README settings table"
        assert var in example, f"{var} missing from .env.example"


def test_readme_starts_with_the_two_commands() -> None:
    head = (REPO / "README.md").read_text().splitlines()[:10]
    assert any(line.startswith("make demo") for line in head)
    assert any(line.startswith("make test") for line in head)
    assert "make test" in (REPO / ".ci" / "run").read_text()

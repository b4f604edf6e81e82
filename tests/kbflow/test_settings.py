"""Settings: defaults, env parsing, clear errors, and docs that match the code."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from core.settings import FIELD_GROUPS, Settings, configure_environment

REPO = Path(__file__).resolve().parents[2]


def test_defaults_and_derived_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KBFLOW_HOME", str(tmp_path / "h"))
    monkeypatch.delenv("KBFLOW_DATABASE_URL", raising=False)  # set in the PostgreSQL pass
    s = Settings()
    assert s.home == tmp_path / "h"
    assert s.registry_url == f"sqlite:///{(tmp_path / 'h' / 'registry.db').resolve()}"
    assert s.vectors_dir == tmp_path / "h" / "vectors"
    assert s.stores.qdrant_url is None


def test_env_values_are_parsed_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KBFLOW_TOP_SECRET_UNKNOWN", "ignored")
    monkeypatch.setenv("KBFLOW_EMBED_BATCH_SIZE", "16")
    assert Settings().ingest.embed_batch_size == 16
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
    names = ["home", *FIELD_GROUPS]  # every field of every group keeps its flat env name
    assert set(FIELD_GROUPS) >= {"rrf_k", "answer_top_k", "database_url", "api_drain_s"}
    for name in names:
        var = f"KBFLOW_{name.upper()}"
        assert f"`{var}`" in readme, f"{var} missing from the README settings table"
        assert var in example, f"{var} missing from .env.example"


def test_flat_names_reach_their_group_with_env_dotenv_default_precedence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text(
        "KBFLOW_RRF_K=5\nKBFLOW_PREFETCH_LIMIT=11\nKBFLOW_ANSWER_TOP_K=3\nKBFLOW_OCR_DPI=300\n"
    )
    monkeypatch.setenv("KBFLOW_RRF_K", "7")  # the environment beats .env
    monkeypatch.setenv("KBFLOW_DENSE_WEIGHT", "0.25")
    s = Settings()
    assert (s.retrieval.rrf_k, s.retrieval.prefetch_limit, s.retrieval.dense_weight) == (
        7,
        11,
        0.25,
    )
    assert (s.answers.answer_top_k, s.extraction.ocr_dpi, s.retrieval.fusion) == (
        3,
        300,
        "weighted",
    )
    # Flat keyword arguments beat both, and the fields not given are still read.
    s = Settings(home=tmp_path / "h", rrf_k=2, answer_top_k=4, answer_model="extractive")
    assert (s.retrieval.rrf_k, s.answers.answer_top_k, s.answers.answer_model) == (
        2,
        4,
        "extractive",
    )
    assert (s.retrieval.prefetch_limit, s.retrieval.dense_weight, s.extraction.ocr_dpi) == (
        11,
        0.25,
        300,
    )
    assert Settings.model_validate({"rrf_k": 8}).retrieval.rrf_k == 8
    with pytest.raises(ValidationError, match="answer_top_k"):
        Settings(answer_top_k=0)


def test_secret_aliases_stay_and_stay_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-plain")
    monkeypatch.setenv("KBFLOW_DOCLING_ARTIFACTS", "/models/docling")
    s = Settings()
    assert s.answers.anthropic_api_key is not None
    assert s.answers.anthropic_api_key.get_secret_value() == "sk-plain"
    assert "sk-plain" not in repr(s) and "sk-plain" not in str(s.model_dump())
    assert s.extraction.docling_artifacts_path == Path("/models/docling")


def test_replace_takes_flat_names_and_model_copy_refuses_them(tmp_path: Path) -> None:
    s = Settings(home=tmp_path, rrf_k=3)
    t = s.replace(rrf_k=9, ocr_dpi=300, home=tmp_path / "other", anthropic_api_key="k")
    assert (t.retrieval.rrf_k, t.extraction.ocr_dpi, t.home) == (9, 300, tmp_path / "other")
    assert t.answers.anthropic_api_key is not None
    assert (s.retrieval.rrf_k, s.extraction.ocr_dpi, s.home) == (3, 200, tmp_path)  # unchanged
    assert t.ingest == s.ingest
    with pytest.raises(ValidationError, match="chunk_overlap_words must be smaller"):
        s.replace(chunk_overlap_words=500)
    with pytest.raises(TypeError, match="no setting"):
        s.replace(rrf=1)
    with pytest.raises(TypeError, match="replace"):
        s.model_copy(update={"rrf_k": 1})  # codemod: keep
    assert s.model_copy(update={"home": tmp_path / "x"}).home == tmp_path / "x"  # codemod: keep
    with pytest.raises(AttributeError):
        s.rrf_k  # type: ignore[attr-defined]  # noqa: B018  # codemod: keep


def test_readme_starts_with_the_two_commands() -> None:
    head = (REPO / "README.md").read_text().splitlines()[:10]
    assert any(line.startswith("make demo") for line in head)
    assert any(line.startswith("make test") for line in head)
    assert "make test" in (REPO / ".ci" / "run").read_text()


def test_per_form_thresholds_default_to_their_calibrated_values() -> None:
    answers = Settings().answers
    assert answers.answer_thresholds() == {
        "question": answers.answer_min_confidence_question,
        "claim": answers.answer_min_confidence_claim,
        "keywords": answers.answer_min_confidence_keywords,
    }
    # a copy made to change another answer setting keeps the calibrated values
    assert Settings().replace(answer_top_k=3).answers.answer_thresholds() == (
        answers.answer_thresholds()
    )


def test_an_explicit_min_confidence_applies_to_every_form_without_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KBFLOW_ANSWER_MIN_CONFIDENCE", "0.6")
    assert Settings().answers.answer_thresholds() == {
        "question": 0.6,
        "claim": 0.6,
        "keywords": 0.6,
    }
    monkeypatch.setenv("KBFLOW_ANSWER_MIN_CONFIDENCE_KEYWORDS", "0.42")  # a form's own wins
    assert Settings().answers.answer_thresholds() == {
        "question": 0.6,
        "claim": 0.6,
        "keywords": 0.42,
    }
    monkeypatch.delenv("KBFLOW_ANSWER_MIN_CONFIDENCE")
    calibrated = Settings().answers
    assert calibrated.answer_thresholds()["keywords"] == 0.42
    assert calibrated.answer_thresholds()["claim"] == calibrated.answer_min_confidence_claim
    assert Settings(answer_min_confidence=0.7).answers.answer_thresholds()["question"] == 0.7
    assert Settings().replace(answer_min_confidence=0.7).answers.answer_thresholds() == {
        "question": 0.7,
        "claim": 0.7,
        "keywords": 0.42,
    }
    monkeypatch.setenv("KBFLOW_ANSWER_MIN_CONFIDENCE_CLAIM", "1.5")
    with pytest.raises(ValidationError, match="answer_min_confidence_claim"):
        Settings()


def test_answer_config_carries_the_per_form_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    from kbflow.services.query.answers import answer_config

    monkeypatch.setenv("KBFLOW_ANSWER_MIN_CONFIDENCE_QUESTION", "0.45")
    config = answer_config(Settings())
    assert config.threshold == Settings().answers.answer_min_confidence  # what old code reads
    assert config.threshold_for("How heavy is the Aurora e-bike?") == 0.45
    assert config.threshold_for("Aurora e-bike weight") == config.thresholds["keywords"]


@pytest.mark.parametrize("off", ["", "none", "OFF"])
def test_the_evidence_floor_is_turned_off_by_an_empty_or_off_value(
    monkeypatch: pytest.MonkeyPatch, off: str
) -> None:
    assert Settings().answers.answer_evidence_floor == 0.35  # calibrated: docs/ANSWERS.md
    monkeypatch.setenv("KBFLOW_ANSWER_EVIDENCE_FLOOR", off)
    assert Settings().answers.answer_evidence_floor is None
    monkeypatch.setenv("KBFLOW_ANSWER_EVIDENCE_FLOOR", "0.2")
    assert Settings().answers.answer_evidence_floor == 0.2
    monkeypatch.setenv("KBFLOW_ANSWER_EVIDENCE_FLOOR", "1.5")
    with pytest.raises(ValidationError):
        Settings()

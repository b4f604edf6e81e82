"""Every file of the shared real-docs set through the ingest flow, and long media as jobs."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from core.models import JobStatus, Scope, SearchMode
from core.settings import Settings
from kbflow.cli import app
from kbflow.services.query.context import open_home
from sinks.connect import open_registry, open_vector_store
from tests.conftest import datasets_dir, make_org, require_binaries

pytestmark = pytest.mark.integration


@pytest.fixture
def whisper_env(monkeypatch: pytest.MonkeyPatch, tiny_whisper_checkpoint: Path) -> None:
    """Transcribe with the real whisper code on the tiny random checkpoint."""
    monkeypatch.setenv("KBFLOW_ASR_ENGINE", "whisper")
    monkeypatch.setenv("KBFLOW_WHISPER_MODEL", str(tiny_whisper_checkpoint))
    monkeypatch.setenv("KBFLOW_ASR_LANGUAGE", "en")


def _chunk_payloads(settings: Settings, doc_id: str) -> list[dict[str, Any]]:
    with open_vector_store(settings) as store:
        return [hit.payload for hit in store.inspect_document_chunks(doc_id)]


def test_every_real_document_ingests_with_its_provenance(
    prefect_harness: None, whisper_env: None
) -> None:
    from flows.ingest import ingest

    require_binaries("tesseract", "ffmpeg", "ffprobe")
    sources = datasets_dir("real-docs", "sources")
    names = sorted(p.name for p in sources.iterdir() if p.is_file())

    make_org("docs")
    report = ingest(paths=[str(sources)], org="docs", collection="real")

    assert report["skipped"] == []
    assert [e["source"] for e in report["empty"]] == ["silent_1s.wav"]
    assert report["empty"][0]["reason"].startswith("silent")
    assert report["documents"] == len(names) - 1
    settings = Settings()
    with open_registry(settings) as registry:
        docs = {Path(d.uri).name: d for d in registry.documents.list_documents("docs")}
    assert sorted(docs) == names  # the silent file is recorded too, so a re-run skips it
    assert docs["silent_1s.wav"].chunk_count == 0

    for name in ("sample_10s.mp3", "sample_10s_video-mp4.mp4"):
        payloads = _chunk_payloads(settings, docs[name].id)
        assert payloads, name
        for payload in payloads:
            assert 0 <= payload["start_s"] < payload["end_s"] <= 10.5, payload
    slides = {p["slide"] for p in _chunk_payloads(settings, docs["powerpoint_sample.pptx"].id)}
    assert slides == {1, 2, 3}
    pages = {p["page"] for p in _chunk_payloads(settings, docs["normal_4pages.pdf"].id)}
    assert pages == {1, 2, 3, 4}

    with open_home(settings) as ctx:
        hits = ctx.search(
            "DocLayNet human-annotated dataset for document layout analysis",
            Scope(org_id="docs"),
            mode=SearchMode.HYBRID,
        )
    tiff = [h for h in hits if h.uri.endswith("2206.01062.tif")]
    assert tiff and tiff[0].location is not None and tiff[0].location.page in (1, 2)

    again = ingest(paths=[str(sources)], org="docs", collection="real")
    assert again["unchanged"] == len(names) and again["documents"] == 0


def _wait_for(job_id: str, timeout_s: float = 240.0) -> dict[str, Any]:
    runner = CliRunner()
    deadline = time.monotonic() + timeout_s
    while True:
        result = runner.invoke(app, ["jobs", "status", job_id, "--json"])
        assert result.exit_code == 0, result.output
        job: dict[str, Any] = json.loads(result.stdout)
        if job["status"] != JobStatus.PROCESSING.value or time.monotonic() > deadline:
            return job
        time.sleep(1)


def test_media_ingests_as_a_job_that_returns_at_once(
    whisper_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_binaries("ffmpeg", "ffprobe")
    clip = tmp_path / "call.mp3"
    shutil.copy(datasets_dir("real-docs", "sources", "sample_10s.mp3"), clip)
    note = tmp_path / "notes.md"
    note.write_text("# Call notes\n\nThe client asked about renewal pricing for next year.\n")
    runner = CliRunner()

    started = time.monotonic()
    make_org("media")
    result = runner.invoke(
        app, ["ingest", str(clip), str(note), "--org", "media", "--collection", "calls", "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    (job,) = report["jobs"]
    assert job["status"] == "PROCESSING" and job["files"] == 1
    assert report["documents"] == 1  # the note, here and now; the recording in the job
    assert time.monotonic() - started < 60

    done = _wait_for(job["id"])
    assert done["status"] == "COMPLETE", done
    assert done["flow_run_id"] and done["report"]["documents"] == 1
    listed = runner.invoke(app, ["jobs", "list", "--org", "media", "--json"])
    assert [j["id"] for j in json.loads(listed.stdout)] == [job["id"]]

    settings = Settings()
    with open_registry(settings) as registry:
        (recording,) = [
            d for d in registry.documents.list_documents("media") if d.uri.endswith(".mp3")
        ]
    payloads = _chunk_payloads(settings, recording.id)
    assert payloads and all("start_s" in p and "end_s" in p for p in payloads)


def test_a_job_whose_files_all_fail_is_failed_with_the_reason(tmp_path: Path) -> None:
    from tests.bad_inputs import silent_video_without_audio

    require_binaries("ffmpeg", "ffprobe")
    video = silent_video_without_audio(tmp_path / "screen.mp4")
    make_org("media")
    result = CliRunner().invoke(app, ["ingest", str(video), "--org", "media", "--json"])
    assert result.exit_code == 0, result.output
    (job,) = json.loads(result.stdout)["jobs"]

    done = _wait_for(job["id"])

    assert done["status"] == "FAILED"
    assert "screen.mp4" in done["reason"] and "no audio track" in done["reason"]


def test_a_job_whose_process_died_is_reported_failed(tmp_path: Path) -> None:
    import subprocess
    import sys

    from kbflow.services.job_runner import refresh
    from sinks.registry import SqlRegistry

    settings = Settings()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    registry = SqlRegistry.open(settings.registry_url)
    try:
        jobs = registry.jobs
        job = jobs.create_job("media", kind="ingest", inputs=["/x.mp3"], params={"org": "media"})
        jobs.update_job_runner(job.id, pid=gone.pid, log_path="/tmp/x.log")
        after = refresh(registry, jobs.get_job(job.id))
    finally:
        registry.close()
    assert after.status is JobStatus.FAILED
    assert "exited without finishing" in (after.reason or "") and "/tmp/x.log" in (
        after.reason or ""
    )

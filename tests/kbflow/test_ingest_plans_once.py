"""`run_ingest` reads and hashes every file once, and plans once (issue 30).

The service discovers, hashes and plans before it decides whether a flow is needed at all; the
flow it starts takes that plan (`tasks.ingest.planned`) instead of reading everything again.
Counted by wrapping the two readers discovery has: `file_sha256` (a file) and `jsonl_sources`
(a corpus, whose records are hashed as it is read).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.contracts import IngestReport, IngestRequest
from core.settings import Settings
from kbflow.services.ingest import run_ingest
from tasks.ingest import discover as discover_module
from tasks.ingest import index as index_module
from tests.conftest import make_org

pytestmark = pytest.mark.integration

ORG = "acme"


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How many times each file was read by discovery (hashed, or a corpus parsed), by name."""
    counts: Counter[str] = Counter()
    real_hash, real_jsonl = discover_module.file_sha256, discover_module.jsonl_sources

    def file_sha256(path: Path) -> str:
        counts[path.name] += 1
        return real_hash(path)

    def jsonl_sources(path: Path) -> Iterator[Any]:
        counts[path.name] += 1
        return real_jsonl(path)

    monkeypatch.setattr(discover_module, "file_sha256", file_sha256)
    monkeypatch.setattr(discover_module, "jsonl_sources", jsonl_sources)
    return counts


@pytest.fixture
def plans(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of sources of each plan made against the registry."""
    made: list[int] = []
    real = index_module.plan_ingest

    def plan_ingest(sources: Any, registry: Any, org_id: str) -> Any:
        made.append(len(sources))
        return real(sources, registry, org_id)

    monkeypatch.setattr(index_module, "plan_ingest", plan_ingest)
    import tasks.ingest.steps as steps

    monkeypatch.setattr(steps, "plan_ingest", plan_ingest)
    return made


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    (folder / "returns.md").write_text("# Returns\n\nBicycles may be returned within 30 days.\n")
    (folder / "sub" / "warranty.md").write_text("# Warranty\n\nFrames carry a 10-year warranty.\n")
    (folder / "care.txt").write_text("Chains want oil every 300 kilometres.\n")
    rows = [
        {"_id": "k1", "title": "Kiln firing", "text": "Stoneware is fired at 1,240 degrees."},
        {"_id": "k2", "title": "Glazes", "text": "Celadon glaze uses iron oxide."},
    ]
    (folder / "kiln.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _run(folder: Path, **kw: Any) -> IngestReport:
    return run_ingest(Settings(), [str(folder)], IngestRequest(org=ORG, collection="kb"), **kw)


FILES = {"returns.md", "warranty.md", "care.txt", "kiln.jsonl"}


def test_one_ingest_reads_and_hashes_each_file_once(
    prefect_harness: None, tmp_path: Path, reads: Counter[str], plans: list[int]
) -> None:
    make_org(ORG)
    folder = _folder(tmp_path)
    stages: list[tuple[str, int, int | None]] = []

    first = _run(folder, wait=True, progress=lambda *a: stages.append(a))
    assert dict(reads) == dict.fromkeys(FILES, 1)  # was 2 each: the flow discovered again
    assert plans == [5]  # was [5, 5]: the flow planned again
    assert (first.discovered, first.new, first.changed, first.unchanged) == (5, 5, 0, 0)
    assert (first.documents, first.skipped) == (5, [])
    assert stages[0] == ("ingest", 0, 5) and ("index", 0, 5) in stages

    # A change: one file is new work, the rest unchanged; still one read each, one plan.
    reads.clear()
    plans.clear()
    (folder / "care.txt").write_text("Chains want oil every 200 kilometres.\n")
    changed = _run(folder, wait=True)
    assert dict(reads) == dict.fromkeys(FILES, 1)
    assert plans == [5]
    assert (changed.discovered, changed.new, changed.changed, changed.unchanged) == (5, 0, 1, 4)
    assert (changed.documents, changed.superseded) == (1, 1)

    # Nothing changed: no flow at all, as before.
    reads.clear()
    plans.clear()
    again = _run(folder, wait=True)
    assert dict(reads) == dict.fromkeys(FILES, 1) and plans == [5]
    assert (again.discovered, again.unchanged, again.documents) == (5, 5, 0)


def test_what_discovery_skipped_is_reported_by_the_run_it_hands_over_to(
    prefect_harness: None, tmp_path: Path, reads: Counter[str]
) -> None:
    """What discovery could not read is in the flow's report: the plan handed over carries it."""
    make_org(ORG)
    folder = _folder(tmp_path)
    real_hash = discover_module.file_sha256  # the counting wrapper

    def unreadable(path: Path) -> str:
        if path.name == "care.txt":
            raise PermissionError(13, "Permission denied", str(path))
        return real_hash(path)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(discover_module, "file_sha256", unreadable)
        report = _run(folder, wait=True)
    assert reads["returns.md"] == 1 and "care.txt" not in reads
    assert (report.discovered, report.new, report.documents) == (4, 4, 4)
    assert [(Path(s.source).name, s.reason.split(":")[0]) for s in report.skipped] == [
        ("care.txt", "cannot be read")
    ]


def test_long_files_go_to_a_job_and_the_rest_is_read_once(
    prefect_harness: None, tmp_path: Path, reads: Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without ``wait`` a long file goes to a background job; the flow indexes the rest from the
    same plan, and the report counts every source found (as when the flow has nothing to do)."""
    make_org(ORG)
    folder = _folder(tmp_path)
    (folder / "manual.md").write_text("# Manual\n\n" + "Spokes are tensioned evenly. " * 40)
    submitted: list[list[str]] = []

    def submit(settings: Settings, paths: list[str], request: IngestRequest, **_: Any) -> Any:
        from types import SimpleNamespace

        submitted.append(paths)
        return SimpleNamespace(id="job-1", status=SimpleNamespace(value="processing"), inputs=paths)

    import kbflow.services.jobs.queue as jobs

    monkeypatch.setattr(jobs, "submit_ingest_job", submit)
    monkeypatch.setenv("KBFLOW_JOB_THRESHOLD_MB", str(500 / (1024 * 1024)))  # 500 bytes
    report = _run(folder, wait=False)
    assert dict(reads) == dict.fromkeys(FILES | {"manual.md"}, 1)
    assert submitted == [[str((folder / "manual.md").resolve())]]
    assert [(j.id, j.files) for j in report.jobs] == [("job-1", 1)]
    assert (report.discovered, report.new, report.unchanged, report.documents) == (6, 5, 0, 5)


def test_the_flow_started_on_its_own_discovers_and_plans_once(
    prefect_harness: None, tmp_path: Path, reads: Counter[str], plans: list[int]
) -> None:
    """As a deployment, a worker or a background job starts it: nothing handed, so the flow
    finds, hashes and plans the files itself, once."""
    from flows.ingest import ingest

    make_org(ORG)
    folder = _folder(tmp_path)
    report = ingest(paths=[str(folder)], org=ORG, collection="kb")
    assert dict(reads) == dict.fromkeys(FILES, 1) and plans == [5]
    assert (report.discovered, report.new, report.documents) == (5, 5, 5)

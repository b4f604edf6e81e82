"""The typed contracts: a report dumps exactly the keys the commands' ``--json`` prints, the
ingest request is one definition for the CLI, the flow and the job row."""

from __future__ import annotations

import datetime as dt
import inspect
import json

import pytest

from core.contracts import (
    IngestReport,
    IngestRequest,
    ItemFailure,
    JobRef,
    ResearchReport,
    ReviewReport,
    SyncCounts,
    SyncReport,
    WithdrawHeld,
)
from core.models import DocStatus
from tasks.ingest.index import BatchReport, IngestPlan, ingest_report

RESEARCH_KEYS = {  # what `kbflow research --json` prints for a run without a review
    "synthesis_run_id", "budget_exceeded", "documents", "consumed_tokens", "doc_ids", "notes",
    "synthesizer", "superseded_drafts", "budget", "budget_stop",
}  # fmt: skip
INGEST_KEYS = {  # what the ingest flow returned (the CLI adds "jobs")
    "org", "collection", "discovered", "new", "changed", "unchanged", "documents", "chunks",
    "superseded", "skipped", "empty", "notes", "seconds", "embed_seconds",
    "resumed",  # added: files a killed run left unfinished, redone in place
}  # fmt: skip


def _research_dict() -> dict[str, object]:
    return {
        "synthesis_run_id": "run-1",
        "budget_exceeded": False,
        "documents": [{"filename": "a.md", "title": "A", "content": "text"}],
        "consumed_tokens": 12,
        "doc_ids": ["d1"],
        "notes": [],
        "synthesizer": "extractive",
        "superseded_drafts": 0,
        "budget": {"fetches": 1, "max_fetches": 5, "tokens": 12, "max_tokens": 99,
                   "exceeded": None},
        "budget_stop": None,
    }  # fmt: skip


def test_a_report_dumps_only_the_keys_it_was_given() -> None:
    report = ResearchReport.model_validate(_research_dict())
    assert set(report.to_dict()) == RESEARCH_KEYS  # no "review": null, no "review_failed"
    assert report.to_dict() == _research_dict()
    reviewed = report.model_copy(
        update={
            "review": ReviewReport(
                org="o", reviewer=None, pending=0, applied=0, skipped=0, failed=0,
                skipped_ids=[], outcomes=[],
            ),
            "review_failed": "nobody came",
        }
    )  # fmt: skip
    assert set(reviewed.to_dict()) == RESEARCH_KEYS | {"review", "review_failed"}
    assert reviewed.to_dict()["review"]["org"] == "o"
    json.dumps(reviewed.to_dict())  # plain JSON all the way down


def test_a_report_reads_like_its_json() -> None:
    report = ResearchReport.model_validate(_research_dict())
    assert report["doc_ids"] == ["d1"]
    assert report["documents"][0]["filename"] == "a.md"  # nested parts too
    assert report["budget"]["max_fetches"] == 5
    assert "review" not in report and "budget_stop" in report  # given (as None) is present
    assert report.get("review") is None and report.get("nope", 7) == 7
    with pytest.raises(KeyError):
        report["nope"]


def test_a_report_refuses_a_key_it_does_not_know() -> None:
    with pytest.raises(ValueError, match="extra"):
        ResearchReport.model_validate(_research_dict() | {"surprise": 1})


def test_the_ingest_report_has_the_flows_keys() -> None:
    total = BatchReport(skipped=[("a.pdf", "encrypted")], notes=[("b.png", "OCR used")])
    report = ingest_report(
        IngestPlan(), total, org="acme", collection="kb", discovered=2, seconds=0.5,
        jobs=[JobRef(id="j1", status="processing", files=1)],
    )  # fmt: skip
    assert isinstance(report, IngestReport)
    out = report.to_dict()
    assert set(out) == INGEST_KEYS | {"jobs"}
    assert out["skipped"] == [{"source": "a.pdf", "reason": "encrypted"}]
    assert out["notes"] == [{"source": "b.png", "note": "OCR used"}]
    assert out["jobs"] == [{"id": "j1", "status": "processing", "files": 1}]
    assert report["skipped"][0]["reason"] == "encrypted"


def test_an_ingest_fails_when_too_many_documents_were_skipped() -> None:
    from core.errors import IngestFailed

    def report(skipped: int, documents: int, unchanged: int = 0) -> IngestReport:
        total = BatchReport(documents=documents, skipped=[(f"{i}.pdf", "encrypted")
                                                         for i in range(skipped)])  # fmt: skip
        plan = IngestPlan(unchanged=unchanged)
        return ingest_report(plan, total, org="o", collection="kb", discovered=0, seconds=0)

    report(skipped=1, documents=1).raise_if_too_many_skipped(0.5)  # half: not more than half
    report(skipped=1, documents=0, unchanged=9).raise_if_too_many_skipped(0.5)  # unchanged: fine
    with pytest.raises(
        IngestFailed, match=r"^2 of 3 documents .*more than 50%.*0.pdf \(encrypted\)"
    ):
        report(skipped=2, documents=1).raise_if_too_many_skipped(0.5)


def test_an_ingest_request_round_trips_through_a_job_row() -> None:
    request = IngestRequest(
        org="acme",
        collection="policies/hr",
        status=DocStatus.PENDING_REVIEW,
        audience="staff",
        effective_date=dt.date(2027, 1, 2),
        source_tag="seed",
    )
    row = json.loads(json.dumps(request.job_params()))  # what the registry stores
    assert row["status"] == "pending_review" and row["effective_date"] == "2027-01-02"
    assert IngestRequest.model_validate(row) == request
    assert request.flow_params()["effective_date"] == dt.date(2027, 1, 2)


def test_the_ingest_flow_takes_the_requests_fields() -> None:
    """The flow's parameters are the request's fields (plus the paths, who runs it and the
    job it does): they cannot drift apart."""
    from flows.ingest import ingest

    params = set(inspect.signature(ingest.fn).parameters)
    assert params == set(IngestRequest.model_fields) | {"paths", "actor", "job_id"}
    defaults = {
        name: p.default
        for name, p in inspect.signature(ingest.fn).parameters.items()
        if name in IngestRequest.model_fields and p.default is not inspect.Parameter.empty
    }
    for name, default in defaults.items():
        assert IngestRequest.model_fields[name].default == default, name


def test_an_ingest_request_applies_the_audience_rule() -> None:
    """One rule for every path (CLI, flow, job row, HTTP upload): `core.ids.audience`."""
    from pydantic import ValidationError

    from core import ids
    from core.errors import ConfigError

    assert IngestRequest(org="acme", audience="exec-team").audience == "exec-team"
    assert IngestRequest(org="acme").audience is None
    for bad in ("EXEC", "exec team", "../x", "", "x" * 65):
        with pytest.raises(ValidationError) as refused:
            IngestRequest(org="acme", audience=bad)
        (error,) = refused.value.errors()
        assert error["loc"] == ("audience",)
        cause = error["ctx"]["error"]
        assert isinstance(cause, ConfigError)
        assert f"audience {bad!r}"[:40] in str(cause) and ids.SLUG_RULE in str(cause)
    with pytest.raises(ValidationError):
        IngestRequest.model_validate({"org": "acme", "audience": "Exec"})  # a job row's params


def test_a_sync_report_dumps_a_syncs_keys_in_their_order() -> None:
    """`kbflow sources sync --json` and the job's result print these keys in this order;
    ``withdraw_held`` only when withdrawals were held."""
    counts = dict.fromkeys(
        ("listed", "new", "changed", "unchanged", "returned", "withdrawn", "failed"), 0
    )
    report = SyncReport(
        started_at="t0", outcome="partial", flow_run_id=None, finished_at="t1", seconds=1.25,
        complete=True, counts=SyncCounts(**counts | {"failed": 1}),
        errors=[ItemFailure(key="a.md", error="too big")], error=None,
    )  # fmt: skip
    dumped = report.to_dict()
    assert list(dumped) == ["started_at", "outcome", "flow_run_id", "finished_at", "seconds",
                            "complete", "counts", "errors", "error"]  # fmt: skip
    assert dumped["counts"] == counts | {"failed": 1} and list(dumped["counts"]) == list(counts)
    assert dumped["errors"] == [{"key": "a.md", "error": "too big"}]
    assert report["counts"]["failed"] == 1 and "withdraw_held" not in report
    report.withdraw_held = WithdrawHeld(gone=2, of=3, max_ratio=0.2, message="held")
    assert list(report.to_dict())[-1] == "withdraw_held" and report["withdraw_held"]["gone"] == 2

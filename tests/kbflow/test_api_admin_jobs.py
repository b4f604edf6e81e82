"""`kbflow serve`'s admin routes that bring knowledge in: the seed bundle, uploads and research
as background jobs, the jobs' status, and provenance — who may call them, what they refuse
(413, 415, hostile file names, bad fields), and what they leave on disk.

While the service runs it owns the embedded store, so a background ingest or research job fails
with "store is busy" until processes can share it: these tests check what does not need a job
to succeed (202, Location, PROCESSING, a terminal state with a readable reason). Seeding runs in
the request through the service's own store, so it works today.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.settings import Settings
from tests import web
from tests.kbflow.service import _call, _clean

JOB_TIMEOUT_S = 300
FAST = {"KBFLOW_STORE_LOCK_TIMEOUT_S": "1", "_drafts": 1}  # a busy store fails a job quickly
SMALL = {**FAST, "KBFLOW_API_MAX_UPLOAD_MB": "0.1"}  # 413s without sending 25 MB
NOTE = "The parental leave policy grants sixteen weeks of paid leave to every employee."
MD = "text/markdown"


def _upload(
    served: dict[str, Any],
    token: str | None,
    name: str = "leave.md",
    data: bytes = f"# Parental leave\n\n{NOTE}\n".encode(),
    content_type: str = MD,
    org: str = "acme",
    **fields: str,
) -> httpx.Response:
    return _call(served, "POST", f"/v1/admin/orgs/{org}/documents", token,
                 files={"file": (name, data, content_type)}, data=fields)  # fmt: skip


def _raw(
    served: dict[str, Any], token: str, path: str, parts: list[tuple[str, str | None, bytes]]
) -> httpx.Response:
    """A multipart body written by hand: (field, file name or None, bytes) per part, so a
    test can send file names no client library would."""
    boundary = "kbflow-test-boundary"
    body = bytearray()
    for field, filename, data in parts:
        disposition = f'form-data; name="{field}"'
        if filename is not None:
            disposition += f'; filename="{filename}"'
        body += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n".encode()
        body += b"Content-Type: text/plain\r\n" if filename is not None else b""
        body += b"\r\n" + data + b"\r\n"
    body += f"--{boundary}--\r\n".encode()
    headers = {
        "Authorization": f"Bearer {served['tokens'][token]}",
        "Content-Type": f"multipart/form-data; boundary={boundary}",
    }
    return web.post(served["base"] + path, content=bytes(body), headers=headers, timeout=60)


def _job_at(served: dict[str, Any], accepted: httpx.Response, token: str = "amy") -> httpx.Response:
    return _call(served, "GET", accepted.headers["location"], token)


def _finished(served: dict[str, Any], accepted: httpx.Response) -> dict[str, Any]:
    """The job's status once it is no longer PROCESSING."""
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while time.monotonic() < deadline:
        job: dict[str, Any] = _job_at(served, accepted).json()
        if job["status"] != "PROCESSING":
            return job
        time.sleep(1)
    raise AssertionError(f"job {accepted.json()['job_id']} still PROCESSING: {job}")


def _denied(served: dict[str, Any]) -> list[tuple[str, str]]:
    trail = _call(served, "GET", "/v1/admin/orgs/acme/audit", "amy", params={"limit": 200})
    return [(r["actor"], r["after"]["attempted"]) for r in trail.json()
            if r["action"] == "kb.access.denied"]  # fmt: skip


@pytest.mark.parametrize("served", [FAST], indirect=True)
def test_a_seed_bundle_over_http(served: dict[str, Any], settings: Settings) -> None:
    files = [
        ("files", ("briefs/q3/brief.txt", f"Acme brief. {NOTE}".encode(), "text/plain")),
        ("files", ("faq.txt", b"Acme sells e-bikes with a two-year warranty.", "text/plain")),
    ]
    fields = {"urls": ["https://acme.example/"], "prompts": ["Focus on the warranty terms."]}
    seeded = _call(served, "POST", "/v1/admin/orgs/acme/seed", "amy", files=files, data=fields)
    assert seeded.status_code == 200, seeded.text
    assert seeded.json()["stored"] == 4 and seeded.json()["skipped"] == []
    _clean(seeded)

    listed = _call(served, "GET", "/v1/admin/orgs/acme/seed", "eve")  # experts may read seeds
    assert listed.status_code == 200, listed.text
    uris = {d["uri"]: d["source_tag"] for d in listed.json()}
    assert uris["upload:acme/brief.txt"] == "am_file"  # the client's folders were dropped
    assert uris["upload:acme/faq.txt"] == "am_file" and uris["https://acme.example/"] == "am_url"
    assert sorted(uris.values()).count("am_prompt") == 1
    _clean(listed)
    assert list((settings.home / "tmp").iterdir()) == []  # the uploads were deleted after

    again = _call(served, "POST", "/v1/admin/orgs/acme/seed", "amy", files=files[:1])
    assert again.status_code == 200 and again.json()["stored"] == 0  # the same file: unchanged
    hits = _call(served, "POST", "/v1/agent/search", "agent", json={"query": NOTE, "top_k": 50})
    assert not [h for h in hits.json()["results"] if h["uri"].startswith("upload:")]

    for parts, field in (
        ([("urls", None, b"ftp://acme.example/")], "urls"),
        ([("prompts", None, b"   ")], "prompts"),
        ([("colour", None, b"red")], "colour"),
        ([("urls", "list.txt", b"https://acme.example/")], "urls"),  # a file where text goes
        ([], "files"),
    ):
        refused = _raw(served, "amy", "/v1/admin/orgs/acme/seed", parts)
        assert refused.status_code == 422, (parts, refused.text)
        assert any(e["field"].endswith(field) for e in refused.json()["errors"]), refused.text
        _clean(refused)

    traced = _call(served, "GET", "/v1/admin/orgs/acme/provenance", "eve",
                   params={"stale": "true", "since": "7d"})  # fmt: skip
    assert traced.status_code == 200 and traced.json() == []
    for params, field in (({}, "doc"), ({"stale": "true", "since": "soon"}, "since"),
                          ({"doc": "../x"}, "doc")):  # fmt: skip
        refused = _call(served, "GET", "/v1/admin/orgs/acme/provenance", "amy", params=params)
        assert refused.status_code == 422, (params, refused.text)
        assert refused.json()["errors"][0]["field"].endswith(field), refused.text
        _clean(refused)
    unknown = _call(served, "GET", "/v1/admin/orgs/acme/provenance", "amy",
                    params={"doc": served["docs"]["globex"]})  # fmt: skip
    assert unknown.status_code == 404  # another org's document is no document of this org


@pytest.mark.parametrize("served", [SMALL], indirect=True)
def test_who_may_bring_knowledge_in(served: dict[str, Any], settings: Settings) -> None:
    seed = {"files": ("brief.txt", b"Acme brief.", "text/plain")}
    research = {"client_name": "Acme"}
    big = b"x" * 300_000  # over the upload cap: refused for who calls before it is read
    cases: list[tuple[str | None, str, str, dict[str, Any], int, str]] = [
        (None, "POST", "/v1/admin/orgs/acme/seed", {"files": seed}, 401, "token"),
        ("agent", "POST", "/v1/admin/orgs/acme/seed", {"files": seed}, 403, "people"),
        ("agent", "POST", "/v1/admin/orgs/acme/research", {"json": research}, 403, "people"),
        ("agent", "GET", "/v1/admin/orgs/acme/provenance?stale=true", {}, 403, "people"),
        ("gus", "POST", "/v1/admin/orgs/acme/seed", {"files": seed}, 403, "may not seed"),
        ("eve", "POST", "/v1/admin/orgs/acme/seed", {"files": seed}, 403, "may not seed"),
        ("gus", "POST", "/v1/admin/orgs/acme/research", {"json": research}, 403, "research"),
        ("eve", "POST", "/v1/admin/orgs/acme/research", {"json": research}, 403, "research"),
        ("gus", "GET", "/v1/admin/orgs/acme/seed", {}, 403, "inspect"),
        ("gus", "GET", "/v1/admin/orgs/acme/provenance?stale=true", {}, 403, "inspect"),
        # An org that does not exist is refused as another org is (nothing said of it).
        ("amy", "POST", "/v1/admin/orgs/no-such-org/research", {"json": research}, 403,
         "does not exist"),
        ("amy", "GET", "/v1/admin/orgs/no-such-org/seed", {}, 403, "does not exist"),
        ("amy", "POST", "/v1/admin/orgs/acme/research", {"json": {"client_name": ""}}, 422, ""),
        ("amy", "POST", "/v1/admin/orgs/acme/research",
         {"json": {"client_name": "Acme", "budget_tokens": 0}}, 422, ""),
        ("amy", "POST", "/v1/admin/orgs/acme/research",
         {"json": {"client_name": "Acme", "reviewer": "eve"}}, 422, "eve"),
    ]  # fmt: skip
    for token, method, path, kw, status, says in cases:
        response = _call(served, method, path, token, **kw)
        assert response.status_code == status, (token, path, response.text)
        assert says in response.text, (token, path, response.text)
        _clean(response)
    for who in ("gus", "eve"):
        refused = _upload(served, who, data=big)
        assert refused.status_code == 403, refused.text  # who, before what is sent
    assert not (settings.home / "uploads").exists() or not any(
        (settings.home / "uploads").iterdir()
    )
    assert {("gus", "seed"), ("eve", "seed"), ("gus", "research"), ("eve", "research"),
            ("gus", "upload"), ("eve", "upload")} <= set(_denied(served))  # fmt: skip


@pytest.mark.parametrize("served", [SMALL], indirect=True)
def test_uploads_and_research_run_as_jobs(served: dict[str, Any], settings: Settings) -> None:
    uploaded = _upload(served, "amy", collection="hr", source_tag="handbook")
    assert uploaded.status_code == 202, uploaded.text
    job_id = uploaded.json()["job_id"]
    assert uploaded.headers["location"] == f"/v1/admin/jobs/{job_id}"
    assert uploaded.json() | {"job_id": ""} == {"job_id": "", "kind": "ingest", "org": "acme",
        "status": "PROCESSING", "file": "leave.md", "type": "md",
        "queued": False, "queue_position": None}  # fmt: skip
    first = _job_at(served, uploaded)
    assert first.status_code == 200 and first.json()["status"] == "PROCESSING", first.text
    assert first.json()["files"] == ["leave.md"] and first.json()["finished_at"] is None
    assert first.json()["params"]["collection"] == "hr"
    _clean(first)
    text = b"Acme sells e-bikes with a two-year warranty."
    brief = [("files", ("brief.txt", text, "text/plain"))]
    seeded = _call(served, "POST", "/v1/admin/orgs/acme/seed", "amy", files=brief,
                   data={"prompts": ["Focus on the warranty terms."]})  # fmt: skip
    assert seeded.status_code == 200, seeded.text  # something for the research run to read
    started = _call(served, "POST", "/v1/admin/orgs/acme/research", "amy",
                    json={"client_name": "Acme", "budget_tokens": 50_000})  # fmt: skip
    assert started.status_code == 202, started.text
    assert started.json()["kind"] == "research" and started.json()["status"] == "PROCESSING"
    # One job of an org at a time (KBFLOW_JOBS_MAX_RUNNING_PER_ORG=1): the research run waits
    # for the upload's job, unless that has ended already.
    assert isinstance(started.json()["queued"], bool)
    if started.json()["queued"]:
        assert started.json()["queue_position"] == 1, started.text
    assert _job_at(served, started).json()["params"]["reviewer"] == "amy"

    # What is refused is refused before any job, and leaves nothing behind.
    stored_before = set((settings.home / "uploads").iterdir())
    for name, data, declared, status, says in (
        ("tool.exe", b"MZ\x90\x00", "application/x-msdownload", 415, "text/markdown"),
        ("report.pdf", b"%PDF-1.7 but declared as audio", "audio/mpeg", 415, "named as .pdf"),
        ("report.pdf", b"plain text, not a PDF", "application/pdf", 415, "its bytes are txt"),
        ("notes", b"no extension and no type", "application/octet-stream", 415, "declares no"),
        ("empty.md", b"", MD, 422, "empty"),
        ("large.md", b"x" * 200_000, MD, 413, "KBFLOW_API_MAX_UPLOAD_MB"),
    ):
        refused = _upload(served, "amy", name, data, declared)
        assert refused.status_code == status, (name, refused.text)
        assert says in refused.json()["detail"], (name, refused.text)
        _clean(refused)
    not_multipart = _call(served, "POST", "/v1/admin/orgs/acme/documents", "amy", json={})
    assert not_multipart.status_code == 415 and "multipart" in not_multipart.json()["detail"]
    for fields, field in (({"effective_date": "soon"}, "effective_date"),
                          ({"collection": "../hr"}, "collection"),
                          ({"status": "published"}, "status"),
                          ({"colour": "red"}, "colour")):  # fmt: skip
        refused = _upload(served, "amy", **fields)
        assert refused.status_code == 422, (fields, refused.text)
        assert refused.json()["errors"][0]["field"].endswith(field), refused.text
    for hostile in ("../../etc/passwd.md", "..", "a\x00b.md", "", "dir/\x1b[31m.md"):
        path = "/v1/admin/orgs/acme/documents"
        refused = _raw(served, "amy", path, [("file", hostile, b"text")])
        assert refused.status_code == 422, (hostile, refused.text)
        assert refused.json()["errors"][0]["field"].endswith("file"), refused.text
        _clean(refused)
    many = [("files", f"f{i}.txt", b"seed") for i in range(21)]
    too_many = _raw(served, "amy", "/v1/admin/orgs/acme/seed", many)
    assert too_many.status_code == 413 and "at most 20" in too_many.json()["detail"]
    bundle = [("files", (f"f{i}.txt", b"x" * 90_000, "text/plain")) for i in range(40)]
    whole = _call(served, "POST", "/v1/admin/orgs/acme/seed", "amy", files=bundle)
    assert whole.status_code == 413, whole.text  # the body as a whole, by its declared size
    assert set((settings.home / "uploads").iterdir()) <= stored_before  # a COMPLETE job's goes
    assert list((settings.home / "tmp").iterdir()) == []
    assert not (settings.home / "etc").exists() and not (settings.home.parent / "etc").exists()

    # Who may follow a job, and ids.
    for token, path, status in (
        ("eve", f"/v1/admin/jobs/{job_id}", 200),  # the org's expert may look
        ("gus", f"/v1/admin/jobs/{job_id}", 403),
        ("agent", f"/v1/admin/jobs/{job_id}", 403),
        (None, f"/v1/admin/jobs/{job_id}", 401),
        ("amy", "/v1/admin/jobs/0123456789ab", 403),  # none, or not hers: one answer
        ("amy", "/v1/admin/jobs/not a job!", 422),
        ("amy", "/v1/admin/jobs/..%2Fregistry.db", 404),
    ):
        response = _call(served, "GET", path, token)
        assert response.status_code == status, (token, path, response.text)
        _clean(response)

    # Each job ends COMPLETE with its report: the job processes reach the store through the
    # service that holds it.
    for accepted in (uploaded, started):
        job = _finished(served, accepted)
        assert job["queued"] is False and job["queue_position"] is None, job
        assert job["finished_at"] is not None and job["flow_run_id"], job
        assert job["status"] == "COMPLETE" and job["error"] is None, (job["kind"], job["error"])
        assert job["result"], job
        _clean(_job_at(served, accepted))
    research = _finished(served, started)
    assert research["synthesis_run_id"], research
    assert list((settings.home / "uploads").iterdir()) == []  # the upload's job is COMPLETE
    metrics = web.get(served["base"] + "/metrics").text  # the research budget, exported
    assert 'kbflow_research_runs_total{status="COMPLETE"} 1.0' in metrics, metrics
    spent = float(research["result"]["consumed_tokens"])
    assert f"kbflow_research_tokens_total {spent}" in metrics, metrics


@pytest.mark.parametrize("served", [FAST], indirect=True)
def test_an_uploaded_document_becomes_searchable(served: dict[str, Any]) -> None:
    uploaded = _upload(served, "amy", collection="hr")
    assert uploaded.status_code == 202, uploaded.text
    job = _finished(served, uploaded)
    assert job["status"] == "COMPLETE", job
    assert job["result"]["documents"] == 1
    hits = _call(served, "POST", "/v1/agent/search", "agent", json={"query": NOTE})
    assert any(NOTE in h["text"] for h in hits.json()["results"]), hits.text


def test_an_upload_says_what_it_is_three_times(tmp_path: Path) -> None:
    """The declared type picks the format; a name or bytes saying otherwise are refused."""
    from core.errors import UnsupportedMediaType
    from tasks.ingest.upload_types import check_upload_bytes, stored_name, upload_kind

    assert upload_kind("notes.md", "text/plain") == "md"  # Markdown sent as plain text
    assert upload_kind("table.CSV", "text/csv; charset=utf-8") == "csv"
    assert upload_kind("deck.pptx", "application/octet-stream") == "pptx"  # undeclared: the name
    assert upload_kind("scan", "image/png") == "png"
    assert stored_name("scan", "png") == "scan.png" and stored_name("a.jpg", "jpeg") == "a.jpg"
    for name, declared in (("a.pdf", "audio/mpeg"), ("a", "application/zip"), ("a", "")):
        with pytest.raises(UnsupportedMediaType):
            upload_kind(name, declared)
    pdf = tmp_path / "a.pdf"
    pdf.write_bytes(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n")
    check_upload_bytes(pdf, "pdf")
    with pytest.raises(UnsupportedMediaType, match="its bytes are pdf"):
        check_upload_bytes(pdf, "mp3")


def test_a_client_file_name_becomes_a_plain_name() -> None:
    from fastapi.exceptions import RequestValidationError

    from kbflow.api.uploads import safe_filename

    assert safe_filename("C:\\Users\\amy\\report.pdf", "file") == "report.pdf"
    assert safe_filename("a/b/.hidden.md", "file") == "hidden.md"
    for hostile in ("", ".", "..", "../x.md", "a/../../x.md", "x\x00.md", "x\n.md", "x" * 300):
        with pytest.raises(RequestValidationError):
            safe_filename(hostile, "file")


# --- admission: many uploads at once -------------------------------------------------------------

LIMITS = {"_drafts": 1, "KBFLOW_JOBS_MAX_RUNNING": "2", "KBFLOW_JOBS_MAX_RUNNING_PER_ORG": "1"}
UPLOADS_AT_ONCE = 30


@pytest.fixture
def shared_prefect(prefect_harness: None, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test harness's Prefect server, exported as PREFECT_API_URL before the service starts:
    its job processes report there instead of each starting a temporary server (~15 s and
    ~600 MB each), as they would beside `kbflow server`."""
    from prefect.settings import PREFECT_API_URL

    url = str(PREFECT_API_URL.value())
    monkeypatch.setenv("PREFECT_API_URL", url)
    return url


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.usefixtures("shared_prefect")
@pytest.mark.parametrize("served", [LIMITS], indirect=True)
def test_uploads_past_the_limits_queue(served: dict[str, Any], settings: Settings) -> None:
    """Thirty uploads at once from two account managers (the per-token burst allows 60): every
    one is accepted (202), at most two job processes ever run, never two of one org, all thirty
    end COMPLETE, their uploads removed, and the job processes' summed RSS stays under two
    jobs' worth."""
    import threading

    from tests.kbflow.support import JOB_RSS_BOUND_MB, JobSampler

    who = {"acme": "amy", "globex": "gus"}
    batch = [("acme" if i % 2 else "globex", i) for i in range(UPLOADS_AT_ONCE)]
    gate = threading.Barrier(len(batch))
    answers: list[httpx.Response | None] = [None] * len(batch)

    def send(slot: int, org: str, i: int) -> None:
        gate.wait()
        data = f"# Note {i}\n\n{NOTE} Copy {i} for {org}.\n".encode()
        answers[slot] = _upload(served, who[org], f"note-{i}.md", data, org=org)

    started = time.monotonic()
    with JobSampler() as sampler:
        threads = [threading.Thread(target=send, args=(n, *b)) for n, b in enumerate(batch)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        accepted = [a for a in answers if a is not None]
        assert [a.status_code for a in accepted] == [202] * len(batch), [
            a.text for a in accepted if a.status_code != 202
        ]
        pending = {a.json()["job_id"]: a for a in accepted}
        orgs = {job_id: a.json()["org"] for job_id, a in pending.items()}
        finished: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + 1200
        while pending and time.monotonic() < deadline:
            time.sleep(3)
            for job_id, a in list(pending.items()):
                job = _call(served, "GET", a.headers["location"], who[orgs[job_id]]).json()
                if job["status"] != "PROCESSING":
                    finished[job_id] = job
                    del pending[job_id]
        assert not pending, f"still PROCESSING after 20 minutes: {sorted(pending)}"
        while time.monotonic() < deadline and any(orgs.keys() & s for s in sampler.samples[-3:]):
            time.sleep(0.5)  # the last job processes exit
    took = time.monotonic() - started

    ids = list(orgs)
    peak_mb = sampler.peak_rss_mb(ids)
    print(
        f"\n{len(batch)} uploads in {took:.0f}s; at most {sampler.peak_running(ids)} job "
        f"processes at once; peak job process RSS {sampler.peak_job_rss_mb(ids):.0f} MB; peak "
        f"summed {peak_mb:.0f} MB (bound {2 * JOB_RSS_BOUND_MB} MB)"
    )
    assert sampler.peak_running(ids) <= 2, sampler.timeline(ids)
    assert max(sampler.peak_running_per_org(orgs).values()) == 1, sampler.timeline(ids)
    assert peak_mb <= 2 * JOB_RSS_BOUND_MB
    # The answers said which waited: all but the two admitted at once, each with its place.
    queued = [a.json() for a in accepted if a.json()["queued"]]
    assert len(queued) >= len(batch) - 2
    assert all(q["queue_position"] >= 1 and q["status"] == "PROCESSING" for q in queued)
    failed = {i: j["error"] for i, j in finished.items() if j["status"] != "COMPLETE"}
    assert not failed, failed
    assert all(j["result"]["documents"] == 1 for j in finished.values())
    assert list((settings.home / "uploads").iterdir()) == []

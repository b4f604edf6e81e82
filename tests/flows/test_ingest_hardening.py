"""Ingest refuses what it must not read, and one bad path never aborts the rest (issue 13).

The ingest flow under Prefect's test harness on real files. Tests run as root in CI, where file
permissions do not stop reads, so an unreadable file or folder is made by failing the read
itself (the same OSError the kernel gives a normal user); a test below does it for real when
not run as root.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from core.errors import ConfigError, IngestFailed
from core.models import Scope, SearchMode
from core.settings import Settings
from kbflow.services.query.context import open_home
from sinks.connect import open_registry
from tasks.ingest import discover as discover_module
from tasks.ingest.discover import discover
from tasks.ingest.extract import SUPPORTED_SUFFIXES

pytestmark = pytest.mark.integration

ORG = "acme"
GOOD = "# Returns\n\nBicycles may be returned within thirty days with the original receipt.\n"


@pytest.fixture
def org() -> None:
    with open_registry(Settings()) as registry:
        registry.people.ensure_org(ORG)


def _ingest(paths: list[str]) -> dict[str, Any]:
    from flows.ingest import ingest

    return ingest(paths=paths, org=ORG, collection="kb")


def _search(query: str) -> list[Any]:
    with open_home(Settings()) as ctx:
        return [
            h for m in SearchMode for h in ctx.search(query, Scope(org_id=ORG), mode=m, top_k=20)
        ]


def _tree(tmp_path: Path) -> Path:
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    (folder / "returns.md").write_text(GOOD)
    (folder / "sub" / "warranty.md").write_text("# Warranty\n\nFrames carry a ten-year warranty.\n")
    return folder


def test_links_inside_a_folder_are_not_followed_out_of_it(
    prefect_harness: None, org: None, tmp_path: Path
) -> None:
    folder = _tree(tmp_path)
    secret = tmp_path / "outside-secret.md"
    secret.write_text("# Secret\n\nThe vault combination is 4-8-15-16-23-42.\n")
    (folder / "passwd.md").symlink_to("/etc/passwd")
    (folder / "secret.md").symlink_to(secret)
    (folder / "sub" / "again.md").symlink_to(folder / "returns.md")  # points inside
    (folder / "loop").symlink_to(folder)  # a folder link back up: never walked

    report = _ingest([str(folder)])
    assert report["documents"] == 2 and not report["skipped"]
    notes = {Path(n["source"]).name: n["note"] for n in report["notes"]}
    assert set(notes) == {"passwd.md", "secret.md", "again.md", "loop"}
    assert "out of the folder" in notes["passwd.md"] and "not followed" in notes["passwd.md"]
    assert "inside the folder" in notes["again.md"]
    assert not any("root:x:0" in h.text or "vault" in h.text for h in _search("root vault"))
    with open_registry(Settings()) as registry:
        uris = {d.uri for d in registry.documents.list_documents(ORG)}
    assert not any("passwd" in u or "secret" in u for u in uris)


def test_a_link_named_on_the_command_line_is_refused(
    prefect_harness: None, org: None, tmp_path: Path
) -> None:
    folder = _tree(tmp_path)
    link = tmp_path / "passwd.md"
    link.symlink_to("/etc/passwd")
    report = _ingest([str(link), str(folder)])
    assert report["documents"] == 2
    [skipped] = report["skipped"]
    assert skipped["source"] == str(link)
    assert "symbolic link" in skipped["reason"] and "/etc/passwd" in skipped["reason"]
    with pytest.raises(IngestFailed, match="symbolic link"):
        _ingest([str(link)])  # nothing else: the run fails, clearly


def test_an_unreadable_file_and_folder_are_reported_and_the_rest_is_ingested(
    prefect_harness: None, org: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _tree(tmp_path)
    (folder / "locked").mkdir()
    (folder / "locked" / "hidden.md").write_text("# Hidden\n\nNever read.\n")
    (folder / "private.md").write_text("# Private\n\nNot readable by us.\n")
    real_scandir, real_hash = os.scandir, discover_module.file_sha256

    def scandir(path: Any) -> Any:
        if Path(path).name == "locked":
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    def file_sha256(path: Path) -> str:
        if path.name == "private.md":
            raise PermissionError(13, "Permission denied", str(path))
        return real_hash(path)

    monkeypatch.setattr(discover_module.os, "scandir", scandir)
    monkeypatch.setattr(discover_module, "file_sha256", file_sha256)
    report = _ingest([str(folder)])
    assert report["documents"] == 2  # returns.md and sub/warranty.md
    reasons = {Path(s["source"]).name: s["reason"] for s in report["skipped"]}
    assert set(reasons) == {"locked", "private.md"}
    assert "permission denied" in reasons["private.md"]
    assert reasons["locked"].startswith("folder cannot be read")
    assert any("thirty days" in h.text for h in _search("returned thirty days receipt"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their permissions")
def test_real_permissions_are_reported_per_path(tmp_path: Path) -> None:
    folder = _tree(tmp_path)
    (folder / "private.md").write_text("x")
    (folder / "private.md").chmod(0)
    (folder / "locked").mkdir()
    (folder / "locked").chmod(0)
    try:
        found = discover([str(folder)], SUPPORTED_SUFFIXES)
    finally:
        (folder / "locked").chmod(0o755)
    assert {Path(s).name for s, _ in found.skipped} == {"private.md", "locked"}
    assert len(found.sources) == 2


def test_an_empty_path_is_refused_not_read_as_the_current_folder(tmp_path: Path) -> None:
    for empty in ("", "   "):
        with pytest.raises(ConfigError, match="empty path"):
            discover([empty], SUPPORTED_SUFFIXES)
    with pytest.raises(ConfigError, match="empty path"):
        discover([str(_tree(tmp_path)), ""], SUPPORTED_SUFFIXES)


def test_devices_and_pipes_are_not_read(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.md"
    os.mkfifo(fifo)
    found = discover([str(fifo), "/dev/zero"], SUPPORTED_SUFFIXES)
    assert found.sources == []
    assert all("not a regular file" in r for _, r in found.skipped)

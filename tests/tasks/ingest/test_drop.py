"""An ``ingest`` deployment run reads only the drop folder (issue 41 #5)."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import Forbidden
from core.models import DocStatus
from core.settings import Settings
from tasks.ingest.drop import DEPLOYMENT_ACTOR, confine_to_drop, deployment_terms


def test_paths_inside_the_drop_folder_are_kept_and_relative_ones_resolved(tmp_path: Path) -> None:
    drop = tmp_path / "drop"
    assert confine_to_drop(drop, ["a.md", "sub/*.pdf", str(drop / "b.md"), "x/../c.md", ""]) == [
        str(drop / "a.md"),
        str(drop / "sub" / "*.pdf"),
        str(drop / "b.md"),
        str(drop / "c.md"),
    ]


@pytest.mark.parametrize("path", ["/etc/passwd", "../secret.md", "sub/../../x", "/**/*.db"])
def test_paths_that_leave_the_drop_folder_are_refused(tmp_path: Path, path: str) -> None:
    with pytest.raises(Forbidden, match="reads only the drop folder"):
        confine_to_drop(tmp_path / "drop", ["fine.md", path])


def test_a_deployment_run_never_publishes_and_names_no_person(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    paths, status, actor = deployment_terms(settings, ["a.md"], DocStatus.APPROVED)
    assert paths == [str((tmp_path / "home" / "drop" / "a.md").resolve())]
    assert (status, actor) == (DocStatus.PENDING_REVIEW, DEPLOYMENT_ACTOR)

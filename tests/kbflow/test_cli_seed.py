"""`kbflow seed` and `kbflow seed list` through the CLI, in-process."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from kbflow.cli import app

runner = CliRunner()


def test_seed_then_list_and_refuse_a_bad_url(tmp_path: Path) -> None:
    assert runner.invoke(app, ["users", "add", "root", "--role", "superadmin"]).exit_code == 0
    made = runner.invoke(app, ["orgs", "create", "fresh", "--name", "Fresh Foods", "--as", "root"])
    assert made.exit_code == 0
    brief = tmp_path / "brief.md"
    brief.write_text("# Brief\n\nWarm, plain tone for busy parents.\n")
    seeded = runner.invoke(
        app,
        ["seed", "--org", "fresh", "--file", str(brief), "--url", "https://fresh.example/",
         "--prompt", "Focus on baby food", "--as", "root", "--json"],
    )  # fmt: skip
    assert seeded.exit_code == 0, seeded.output
    assert json.loads(seeded.output)["stored"] == 3
    listed = runner.invoke(app, ["seed", "list", "--org", "fresh", "--as", "root", "--json"])
    assert sorted(d["source_tag"] for d in json.loads(listed.output)) == [
        "am_file",
        "am_prompt",
        "am_url",
    ]
    bad = runner.invoke(
        app, ["seed", "--org", "fresh", "--url", "ftp://fresh.example/x", "--as", "root"]
    )
    assert bad.exit_code == 1 and "not an http(s) URL" in bad.output
    missing_org = runner.invoke(app, ["seed", "--org", "nope", "--prompt", "x", "--as", "root"])
    assert missing_org.exit_code == 1 and "does not exist" in missing_org.output

"""The one wrapper every command runs in (`kbflow.cli.common.command`): settings in, kbflow's
errors out as one message and an exit code; and the entry points beside the CLI use services."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from core.errors import Forbidden, KbflowError, ReviewConflict, StoreBusy
from core.settings import Settings
from kbflow.cli.common import EXIT_CONFLICT, STORE_BUSY_AFTER_DECISION, command

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _program(error: Exception | None, *, review: bool = False) -> typer.Typer:
    program = typer.Typer()

    @program.command()
    @command(review=review)
    def run(settings: Settings, name: str = "x") -> None:
        """Say where the data lives."""
        if error is not None:
            raise error
        typer.echo(f"{name} {settings.home.name}")

    @program.command()
    @command
    def plain() -> None:
        raise KbflowError("no settings needed")

    return program


def test_settings_are_loaded_and_hidden_from_the_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KBFLOW_HOME", "/tmp/kbflow-common-home")
    done = runner.invoke(_program(None), ["run", "--name", "y"])
    assert done.exit_code == 0, done.output
    assert done.output.strip() == "y kbflow-common-home"
    helped = runner.invoke(_program(None), ["run", "--help"])
    assert "--name" in helped.output and "settings" not in helped.output
    assert "Say where the data lives." in helped.output


def test_bad_settings_exit_2_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KBFLOW_MAX_SKIP_RATIO", "lots")
    done = runner.invoke(_program(None), ["run"])
    assert done.exit_code == 2 and "invalid settings" in done.output


def test_a_kbflow_error_is_one_message_and_exit_1() -> None:
    done = runner.invoke(_program(KbflowError("the [draft] memo.md is bad")), ["run"])
    assert done.exit_code == 1
    assert done.output.strip() == "error: the [draft] memo.md is bad"  # markup escaped
    assert runner.invoke(_program(None), ["plain"]).exit_code == 1


def test_other_errors_keep_their_traceback() -> None:
    done = runner.invoke(_program(RuntimeError("a bug")), ["run"])
    assert done.exit_code == 1 and isinstance(done.exception, RuntimeError)


@pytest.mark.parametrize(
    ("error", "review", "code", "first_line"),
    [
        (ReviewConflict("decided"), True, EXIT_CONFLICT, "conflict: decided"),
        (ReviewConflict("decided"), False, 1, "error: decided"),
        (Forbidden("not yours"), True, 1, "forbidden: not yours"),
        (Forbidden("not yours"), False, 1, "error: not yours"),
        (StoreBusy("busy"), False, 1, "error: busy"),
    ],
)
def test_the_review_voice(error: KbflowError, review: bool, code: int, first_line: str) -> None:
    done = runner.invoke(_program(error, review=review), ["run"])
    assert done.exit_code == code
    assert done.output.splitlines()[0] == first_line


def test_a_busy_store_after_a_decision_says_how_to_recover() -> None:
    done = runner.invoke(_program(StoreBusy("busy"), review=True), ["run"])
    assert done.exit_code == 1
    assert " ".join(done.output.split()) == f"error: busy {STORE_BUSY_AFTER_DECISION}"


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


SERVICES = sorted(str(p.relative_to(REPO)) for p in (REPO / "kbflow" / "services").rglob("*.py"))


@pytest.mark.parametrize("path", ["kbflow/demo.py", "bench/ingest_scifact.py", *SERVICES])
def test_entry_points_beside_the_cli_call_services_not_the_cli(path: str) -> None:
    assert [m for m in _imports(REPO / path) if m.split(".")[:2] == ["kbflow", "cli"]] == []


@pytest.mark.parametrize("path", SERVICES)
def test_services_render_nothing(path: str) -> None:
    """Services return values; showing them (rich, typer) is the entry point's job."""
    assert [m for m in _imports(REPO / path) if m.split(".")[0] in ("rich", "typer")] == []

"""The CLI's surface is a contract (README, Commands): every command, argument and option, with
its names, defaults, bounds and help, stays as recorded in ``cli_surface.json``.

The fixture was captured from the single-module CLI before it became a package (issue 14). A
deliberate change to the surface regenerates it: ``WRITE_CLI_SURFACE=1 pytest
tests/kbflow/test_cli_surface.py``, and the diff shows exactly what changed.
"""

from __future__ import annotations

import enum
import json
import os
from pathlib import Path
from typing import Any

import typer

from kbflow.cli import app

FIXTURE = Path(__file__).with_name("cli_surface.json")


def _plain(value: Any) -> Any:
    """A default as JSON: enums by value, paths as text, tuples as lists."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)


def _type(param: Any) -> dict[str, Any]:
    kind = param.type
    out: dict[str, Any] = {"name": kind.name}
    for attr in ("choices", "min", "max", "min_open", "max_open", "clamp", "exists"):
        if hasattr(kind, attr):
            out[attr] = _plain(getattr(kind, attr))
    return out


def _param(param: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": param.name,
        "kind": param.param_type_name,
        "opts": list(param.opts),
        "secondary_opts": list(param.secondary_opts),
        "required": param.required,
        "default": _plain(param.default),
        "multiple": param.multiple,
        "nargs": param.nargs,
        "type": _type(param),
        "checked": param.callback is not None,  # a value check such as `core.ids.org_id`
    }
    if param.param_type_name == "option":
        out |= {"is_flag": param.is_flag, "hidden": param.hidden}
    out["help"] = getattr(param, "help", None)
    return out


def _command(path: str, command: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "path": path,
        "help": command.help,
        "params": [_param(p) for p in command.params],
    }
    if hasattr(command, "commands"):  # a group (typer ships its own click: duck-typed)
        out["commands"] = list(command.commands)  # as `--help` lists them
        out["no_args_is_help"] = command.no_args_is_help
        out["invoke_without_command"] = command.invoke_without_command
    return out


def surface(program: typer.Typer) -> list[dict[str, Any]]:
    """Every command of ``program`` (groups included), depth first in name order."""
    found: list[dict[str, Any]] = []

    def walk(path: str, command: Any) -> None:
        found.append(_command(path, command))
        if hasattr(command, "commands"):
            for name in sorted(command.commands):
                walk(f"{path} {name}", command.commands[name])

    walk("kbflow", typer.main.get_command(program))
    return found


def test_the_cli_surface_is_unchanged() -> None:
    now = surface(app)
    if os.environ.get("WRITE_CLI_SURFACE"):
        FIXTURE.write_text(json.dumps(now, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    recorded = json.loads(FIXTURE.read_text(encoding="utf-8"))
    assert [c["path"] for c in now] == [c["path"] for c in recorded]
    for before, after in zip(recorded, now, strict=True):
        assert after == before, before["path"]


def test_the_surface_covers_every_command() -> None:
    recorded = json.loads(FIXTURE.read_text(encoding="utf-8"))
    groups = [c["path"] for c in recorded if "commands" in c]
    leaves = [c["path"] for c in recorded if "commands" not in c]
    assert len(groups) == 1 + 15 and len(leaves) >= 56
    for command in (
        "kbflow ingest",
        "kbflow review approve",
        "kbflow eval run",
        "kbflow seed",
        "kbflow sources sync",
    ):
        assert command in groups + leaves

"""The house has floors, and imports only go down (docs/ARCHITECTURE.md); the query path never
imports Prefect.

Floors, top to bottom: ``bench`` (benchmarks: they measure the app, nothing imports them),
``kbflow`` (the app: CLI, services, demo), ``flows``, ``evals``,
``tasks``, ``sinks``, ``core`` (settings, models, errors). A module may import its own floor or a
lower one, and no two modules import each other, directly or round a circle. The check reads
every import statement of every module with ``ast``, imports inside functions included: a lazy
import is still a dependency.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.imports_graph import (
    FLOORS,
    REPO,
    _is_under,
    imports_of,
    project_imports,
    project_modules,
)

QUERY_PATH = (
    "tasks.query.retrieve",
    "tasks.text.embed",
    "tasks.text.sparse",
    "kbflow.services.query.context",
    "kbflow.services.query.answers",
    "kbflow.services.query.tools",
    "kbflow.api.app",
    "kbflow.api.errors",
    "kbflow.api.auth",
    "kbflow.api.agent",
    "kbflow.api.review",
    "kbflow.api.seeds",
    "kbflow.api.research",
    "kbflow.api.documents",
    "kbflow.api.jobs",
    "kbflow.api.provenance",
    "kbflow.api.health",
    "kbflow.api.deps",
    "kbflow.api.schemas",
    "kbflow.api.mcp",
    "kbflow.api.uploads",
    "tasks.answer.turns",
    "tasks.answer.knowledge_search",
    "tasks.answer.cited_answer",
    "tasks.answer.replay",
    "tasks.answer.contract",
    "tasks.answer.extractive",
    "tasks.answer.claude",
    "tasks.llm",
    "tasks.answer.confidence",
    *sorted(f"sinks.{p.stem}" for p in (REPO / "sinks").glob("*.py") if p.stem != "__init__"),
)


def test_the_scan_finds_the_tree() -> None:
    modules = project_modules()
    assert {
        "kbflow.cli",
        "core.models",
        "sinks.gate",
        "tasks.query.retrieve",
        "flows.ingest",
    } <= set(modules)
    assert "sinks.gate" in imports_of("tasks.query.retrieve")
    assert "prefect" in imports_of("flows.ingest")
    assert "core.models" in imports_of("sinks.gate")


def forbidden_imports(modules: list[str], banned: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{module} imports {name}"
        for module in modules
        for name in imports_of(module)
        if any(_is_under(name, b) for b in banned)
    )


def floor_of(module: str) -> int:
    return FLOORS.index(module.split(".")[0])


def test_every_module_is_on_a_floor() -> None:
    stray = [m for m in project_modules() if m.split(".")[0] not in FLOORS]
    assert stray == []
    tops = {p.name for p in REPO.iterdir() if (p / "__init__.py").is_file()}
    assert tops <= set(FLOORS) | {"tests"}, tops - set(FLOORS)


def test_no_import_runs_up_a_floor() -> None:
    upward = sorted(
        f"{m} ({FLOORS[floor_of(m)]}) imports {i} ({FLOORS[floor_of(i)]})"
        for m in project_modules()
        for i in project_imports(m)
        if floor_of(i) > floor_of(m)
    )
    assert upward == []


def test_no_import_circles() -> None:
    """Tarjan's strongly connected components over the whole module graph: none has two."""
    graph = {m: sorted(project_imports(m)) for m in project_modules()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in graph:
        if node not in index:
            visit(node)
    assert circles == []


def test_the_core_imports_nothing_of_ours() -> None:
    core = [m for m in project_modules() if m.startswith("core")]
    assert {"core.settings", "core.models", "core.errors"} <= set(core)
    assert [
        f"{m} imports {i}" for m in core for i in project_imports(m) if not i.startswith("core")
    ] == []


def test_process_tracking_needs_only_the_core_and_psutil() -> None:
    """kbflow.services.orchestration.processes runs at every CLI start and in the job runner: no
    layer above the core,
    no Prefect (it finds Prefect's server by its command line instead)."""
    allowed = ("core.settings", "core.models", "core.errors", "psutil")
    outside = sorted(
        name
        for name in imports_of("kbflow.services.orchestration.processes")
        if name.split(".")[0] not in sys.stdlib_module_names
        and not any(_is_under(name, a) for a in allowed)
    )
    assert outside == []


def query_path_closure() -> dict[str, str]:
    """Every project module the query path reaches, mapped to the module that first imports it."""
    reached: dict[str, str] = {m: "<query path>" for m in QUERY_PATH}
    todo = list(QUERY_PATH)
    while todo:
        module = todo.pop()
        for name in imports_of(module):
            for candidate in (name, name.rpartition(".")[0]):
                if candidate in project_modules() and candidate not in reached:
                    reached[candidate] = module
                    todo.append(candidate)
    return reached


def test_nothing_on_the_query_path_imports_prefect() -> None:
    reached = query_path_closure()
    assert "sinks.gate" in reached and "tasks.text.sparse" in reached
    offenders = forbidden_imports(sorted(reached), ("prefect",))
    chains = [f"{o} (reached via {reached[o.split()[0]]})" for o in offenders]
    assert chains == []


def test_query_path_does_not_reach_the_orchestration_modules() -> None:
    reached = query_path_closure()
    assert not [m for m in reached if _is_under(m, "flows") or m.endswith(".steps")]


def _imported_after(statement: str, tmp_path: Path) -> set[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["KBFLOW_HOME"] = str(tmp_path / "home")
    code = f"{statement}; import sys, json; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.integration
def test_importing_the_query_path_does_not_load_prefect(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["KBFLOW_HOME"] = str(tmp_path / "home")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import kbflow.cli, kbflow.services.query.context, tasks.query.retrieve, sys; "
            "assert 'prefect' not in sys.modules, 'prefect was imported'",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.integration
def test_importing_the_query_path_loads_no_heavy_library(tmp_path: Path) -> None:
    """Models and heavy libraries load lazily, never at import time (STYLE habit 4)."""
    loaded = _imported_after(
        "import kbflow.cli, kbflow.services.query.context, tasks.query.retrieve", tmp_path
    )
    heavy = {"prefect", "great_expectations", "torch", "sentence_transformers", "docling", "dlt"}
    assert loaded & heavy == set()


def test_search_never_uses_the_inspection_or_maintenance_paths() -> None:
    """Reviewers and the reconciler read stored chunks whatever their status; search must not."""
    query_path = [
        REPO / "tasks" / "query" / "retrieve.py",
        REPO / "kbflow" / "services" / "query" / "context.py",
    ]
    for path in query_path:
        source = path.read_text()
        for name in (
            "inspect_document_chunks",
            "iter_payloads",
            "export_points",
            "inspect_draft",
            "retrieve_points",
        ):
            assert name not in source, f"{path.name} uses {name}"

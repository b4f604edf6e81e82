"""The project's import graph, read with ``ast`` from every module of its packages (imports
inside functions included: a lazy import is still a dependency). The rules tests
(tests/test_layers.py, tests/test_house.py) check it."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FLOORS = ("core", "sinks", "tasks", "evals", "flows", "kbflow", "bench")  # bottom to top
PACKAGES = FLOORS


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def project_modules() -> dict[str, Path]:
    return {
        module_name(file): file
        for package in PACKAGES
        if (REPO / package).is_dir()
        for file in sorted((REPO / package).rglob("*.py"))
    }


@cache
def imports_of(module: str) -> frozenset[str]:
    """Absolute names of everything ``module`` imports (relative imports resolved)."""
    path = project_modules()[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                prefix = ".".join([*base, node.module] if node.module else base)
            else:
                prefix = node.module or ""
            found.add(prefix)
            # ``from pkg import mod`` may import a submodule: record it when it is one of ours.
            for alias in node.names:
                candidate = f"{prefix}.{alias.name}"
                if candidate in project_modules():
                    found.add(candidate)
    return frozenset(found)


def _is_under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def modules_in(*packages: str) -> list[str]:
    return [m for m in project_modules() if any(_is_under(m, p) for p in packages)]


def project_imports(module: str) -> set[str]:
    """The project modules ``module`` imports (a name resolves to the module it names, or to
    the module it is defined in)."""
    out: set[str] = set()
    for name in imports_of(module):
        for candidate in (name, name.rpartition(".")[0]):
            if candidate in project_modules() and candidate != module:
                out.add(candidate)
                break
    return out

"""Conventions of the test suite itself (issue 43): no module under ``tests/`` imports from a test
module (a file named ``test_*.py``). Importing one is fragile: pytest registers its fixtures
again in the importer, and the importer depends on a module that pytest also collects. A shared
fixture belongs in the nearest ``conftest.py`` above all its users (pytest finds it without an
import), a shared helper in a module that is not a test module (``support.py``, ...).

The check reads every ``.py`` file under ``tests/`` with ``ast``: import statements (inside
functions too, relative ones resolved), and code held in strings for another interpreter
(``python -c "from tests... import ..."``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


# Imports in code held in a string: ``from tests.x import a, b`` and ``import tests.x``.
CODE_FROM = re.compile(r"\bfrom\s+(tests(?:\.\w+)*)\s+import\s+\(?\s*(\w+(?:\s*,\s*\w+)*)")
CODE_IMPORT = re.compile(r"\bimport\s+(tests(?:\.\w+)+)")


def _module_file(name: str) -> Path:
    return REPO.joinpath(*name.split(".")).with_suffix(".py")


def _is_test_module(name: str) -> bool:
    """Whether the dotted ``name`` is a module of ours in a file named ``test_*.py``."""
    return name.rpartition(".")[2].startswith("test_") and _module_file(name).is_file()


def _from_import(module: str, names: list[str]) -> set[str]:
    """The modules ``from module import names`` imports: ``module`` itself, and each name that
    is a submodule of it (a test module imported by name from its package)."""
    return {module} | {
        f"{module}.{name}" for name in names if _module_file(f"{module}.{name}").is_file()
    }


def imported_modules(source: str, package: str) -> set[str]:
    """Every module of ``tests`` that ``source`` (a module of ``package``) imports, or that code
    in its strings imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found |= _from_import(module, [alias.name for alias in node.names])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for match in CODE_FROM.finditer(node.value):
                found |= _from_import(match[1], re.split(r"\s*,\s*", match[2]))
            found.update(match[1] for match in CODE_IMPORT.finditer(node.value))
    return {name for name in found if name == "tests" or name.startswith("tests.")}


def suite_imports() -> dict[str, set[str]]:
    """Per file under ``tests/`` (relative to the repository): the modules of ``tests`` it
    imports."""
    return {
        str(path.relative_to(REPO)): imported_modules(
            path.read_text(encoding="utf-8"), ".".join(path.relative_to(REPO).parent.parts)
        )
        for path in sorted(TESTS.rglob("*.py"))
        if "__pycache__" not in path.parts
    }


def test_modules_import_no_test_module() -> None:
    imports = suite_imports()
    assert "tests.conftest" in imports["tests/tasks/answer/test_answer.py"]  # the scan reads them
    offenders = sorted(
        f"{path} imports {name}"
        for path, names in imports.items()
        for name in names
        if _is_test_module(name)
    )
    assert not offenders, (
        "move the shared fixture into the nearest conftest.py above its users, the shared helper "
        "into a module not named test_*.py:\n" + "\n".join(offenders)
    )


@pytest.mark.parametrize(
    "code",
    [
        "from {package}.{module} import x",
        "import {package}.{module}",
        "from {package} import conftest, {module}",
        "def f():\n    from .{module} import x",
        "CODE = 'import sys; from {package}.{module} import x; print(x)'",
    ],
    ids=["from-it", "import-it", "from-its-package", "relative-in-a-function", "in-a-string"],
)
def test_each_way_of_importing_a_test_module_is_found(code: str) -> None:
    source = code.format(package="tests.kbflow", module="test_api")
    assert "tests.kbflow.test_api" in imported_modules(source, "tests.kbflow")
    assert _is_test_module("tests.kbflow.test_api")
    assert not _is_test_module("tests.kbflow.support") and not _is_test_module("tests.conftest")

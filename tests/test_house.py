"""The shape of the house (issue 30): the app floor stands on few floors, its service layer has
one module per name, and no product file grows past 500 lines without saying why.

`tests/test_layers.py` holds the floors between packages; these rules hold ``kbflow/`` itself.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path

from tests.imports_graph import REPO, modules_in, project_imports

PRODUCT = ("core", "sinks", "tasks", "flows", "kbflow", "evals")
LONG = 500
REASON = "# Over 500 lines:"
MAX_APP_FLOORS = 5


def _room(module: str) -> str:
    """The room a module of ``kbflow`` stands in: its subpackage (``kbflow.services``) or, for a
    module directly in ``kbflow/``, the module itself."""
    parts = module.split(".")
    if len(parts) >= 3 or (len(parts) == 2 and (REPO / "kbflow" / parts[1]).is_dir()):
        return ".".join(parts[:2])
    return module


def _room_imports() -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {}
    for module in modules_in("kbflow"):
        room = _room(module)
        if room == "kbflow":
            continue
        rooms.setdefault(room, set())
        for name in project_imports(module):
            if name.split(".")[0] == "kbflow" and _room(name) not in (room, "kbflow"):
                rooms[room].add(_room(name))
    return rooms


def test_the_app_floor_stands_on_at_most_five_floors_without_a_circle() -> None:
    rooms = _room_imports()

    @cache
    def floor(room: str, seen: frozenset[str] = frozenset()) -> int:
        assert room not in seen, f"an import circle through {room}"
        below = [floor(r, seen | {room}) for r in rooms.get(room, ())]
        return 1 + max(below, default=0)

    floors = {room: floor(room) for room in rooms}
    assert max(floors.values()) <= MAX_APP_FLOORS, floors
    # the surfaces stand on the services, never the other way round
    services = rooms["kbflow.services"]
    assert services <= {"kbflow.render", "kbflow.flow_cli"}, services


def test_the_service_layer_has_one_module_per_name() -> None:
    """Nothing beside kbflow/services/ repeats one of its names (two service layers, once)."""
    services = {m.rpartition(".")[2] for m in modules_in("kbflow.services")}
    beside = [
        m.rpartition(".")[2]
        for m in modules_in("kbflow")
        if m.count(".") == 1 and not (REPO / "kbflow" / m.rpartition(".")[2]).is_dir()
    ]
    assert not services & set(beside), services & set(beside)


def test_no_product_file_is_long_without_a_reason() -> None:
    long = [
        f"{path.relative_to(REPO)} ({n} lines)"
        for package in PRODUCT
        for path in sorted((REPO / package).rglob("*.py"))
        if "migrations" not in path.parts
        and (n := len(path.read_text(encoding="utf-8").splitlines())) > LONG
        and not path.read_text(encoding="utf-8").startswith(REASON)
    ]
    assert not long, f"over {LONG} lines with no '{REASON} …' line at the top: {long}"


SERVICE_DOMAINS = frozenset(
    {"query", "catalog", "review", "research", "sources", "jobs", "backup", "orchestration"}
)
SERVICE_MODULES_BESIDE = frozenset({"ingest", "evals", "job_runner"})


def test_the_services_are_grouped_by_domain_with_private_helpers_kept_inside() -> None:
    """kbflow/services/ is a sub-package per domain (each says what it owns) and three
    modules beside them; a module whose name starts with an underscore is imported only from
    its own domain."""
    root = REPO / "kbflow" / "services"
    domains = {p.name for p in root.iterdir() if p.is_dir() and p.name != "__pycache__"}
    beside = {p.stem for p in root.glob("*.py")} - {"__init__"}
    assert domains == SERVICE_DOMAINS, domains
    assert beside == SERVICE_MODULES_BESIDE, beside
    for domain in domains:
        init = root / domain / "__init__.py"
        assert init.exists() and init.read_text().startswith('"""'), f"{domain}: no docstring"
    leaks = [
        f"{module} imports {name}"
        for module in modules_in("kbflow", "flows", "tasks", "sinks", "core", "evals")
        for name in project_imports(module)
        if name.startswith("kbflow.services.")
        and name.rpartition(".")[2].startswith("_")
        and not module.startswith(name.rpartition(".")[0] + ".")
    ]
    assert not leaks, leaks


# The free-form JSON a service may return under a name of its own, each with why no typed dict
# describes it (issue 43).
FREE_FORM_JSON = frozenset(
    {
        "JsonSchema",  # query/types.py: a JSON Schema document
        "EvalRunRow",  # evals.py: a warehouse row, one column per metric the warehouse declares
    }
)


def _holds_any_dict(node: ast.expr, aliases: frozenset[str] = frozenset()) -> bool:
    """Whether the annotation ``node`` is or holds ``dict[str, Any]`` (``Dict`` too, quoted
    or not), or one of ``aliases``, names that stand for it."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):  # a quoted annotation
            try:
                quoted = ast.parse(sub.value, mode="eval").body
            except SyntaxError:
                continue
            if _holds_any_dict(quoted, aliases):
                return True
        elif isinstance(sub, ast.Name | ast.Attribute):
            if (sub.id if isinstance(sub, ast.Name) else sub.attr) in aliases:
                return True
        elif isinstance(sub, ast.Subscript) and isinstance(sub.slice, ast.Tuple):
            names = [ast.unparse(n).rpartition(".")[2] for n in (sub.value, *sub.slice.elts)]
            if names in (["dict", "str", "Any"], ["Dict", "str", "Any"]):
                return True
    return False


def _assignments(tree: ast.Module) -> Iterator[tuple[str, ast.expr]]:
    """A module's top-level ``NAME = value`` and ``NAME: T = value``."""
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if len(targets) == 1 and isinstance(targets[0], ast.Name):
                yield targets[0].id, node.value


def _any_dict_aliases(trees: Iterable[ast.Module]) -> frozenset[str]:
    """The top-level names that stand for ``dict[str, Any]``: ``X = dict[str, Any]``, ``X:
    TypeAlias = ...``, and names made of them (``Y = list[X] | None``)."""
    aliased = [
        (name, value)
        for tree in trees
        for name, value in _assignments(tree)
        if isinstance(value, ast.Subscript | ast.BinOp | ast.Name | ast.Attribute)
    ]
    found: frozenset[str] = frozenset()
    while True:
        more = found | {name for name, value in aliased if _holds_any_dict(value, found)}
        if more == found:
            return found
        found = more


def _public_functions(body: list[ast.stmt]) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The public functions of a module's (or a public class's) body, methods included."""
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if not node.name.startswith("_"):
                yield node
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            yield from _public_functions(node.body)


def _private_module(path: Path) -> bool:
    """Whether a module (its path in its package) is private: a part of it starts with ``_``."""
    return any(p.startswith("_") for p in path.with_suffix("").parts if p != "__init__")


def test_no_public_service_returns_an_untyped_dict() -> None:
    """A public service says what its JSON holds — a typed dict, a model or a record — never
    ``dict[str, Any]``; JSON that nothing can describe has a name in `FREE_FORM_JSON`."""
    root = REPO / "kbflow" / "services"
    trees: dict[Path, ast.Module] = {
        path: ast.parse(path.read_text(encoding="utf-8")) for path in sorted(root.rglob("*.py"))
    }
    aliases = _any_dict_aliases(trees.values())
    assert aliases >= FREE_FORM_JSON, f"no longer defined: {sorted(FREE_FORM_JSON - aliases)}"
    untyped = [
        f"{path.relative_to(REPO)}:{fn.lineno} {fn.name} -> {ast.unparse(fn.returns)}"
        for path, tree in trees.items()
        if not _private_module(path.relative_to(root))
        for fn in _public_functions(tree.body)
        if fn.returns is not None and _holds_any_dict(fn.returns, aliases - FREE_FORM_JSON)
    ]
    assert not untyped, f"public services returning dict[str, Any] (say what it holds): {untyped}"


# The free-form values kbflow/api may return under a name of its own, each with why no typed
# dict or model stands for it (issue 43).
FREE_FORM_API = frozenset(
    {
        "LogConfig",  # logs.py: a logging dictConfig; uvicorn's log_config takes a plain dict
        "OpenApiExtra",  # uploads.py: an OpenAPI fragment; FastAPI's openapi_extra: a plain dict
    }
)


def test_no_public_api_function_returns_an_untyped_dict() -> None:
    """A route of kbflow/api returns its response model, a helper a typed dict or a model, never
    ``dict[str, Any]`` (nested functions and methods too); a value free-form by nature has a
    name in `FREE_FORM_API`."""
    root = REPO / "kbflow" / "api"
    trees = {
        path: ast.parse(path.read_text(encoding="utf-8")) for path in sorted(root.rglob("*.py"))
    }
    aliases = _any_dict_aliases(trees.values())
    assert aliases >= FREE_FORM_API, f"no longer defined: {sorted(FREE_FORM_API - aliases)}"
    untyped = [
        f"{path.relative_to(REPO)}:{fn.lineno} {fn.name} -> {ast.unparse(fn.returns)}"
        for path, tree in trees.items()
        for fn in ast.walk(tree)
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
        and not fn.name.startswith("_")
        and fn.returns is not None
        and _holds_any_dict(fn.returns, aliases - FREE_FORM_API)
    ]
    assert not untyped, f"kbflow/api functions returning dict[str, Any] (say what it is): {untyped}"


def _domain_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] == ["kbflow", "services"] and len(parts) > 2 and parts[2] in SERVICE_DOMAINS:
        return parts[2]
    return None


def test_a_domain_imports_another_only_through_its_public_names() -> None:
    """Inside kbflow/services/, a module reaches another domain only through the names that
    domain's package lists in its ``__all__`` (``from kbflow.services.jobs import start_job``),
    never one of its modules directly: what a domain offers the others is one short list."""
    import importlib

    public = {
        domain: set(getattr(importlib.import_module(f"kbflow.services.{domain}"), "__all__", ()))
        for domain in SERVICE_DOMAINS
    }
    reached = []
    for module in modules_in("kbflow.services"):
        path = REPO / (module.replace(".", "/") + ".py")
        if not path.exists():
            path = REPO / module.replace(".", "/") / "__init__.py"
        own = _domain_of(module)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                named = [(alias.name, None) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                named = [(node.module, alias.name) for alias in node.names]
            else:
                continue
            for target, name in named:
                domain = _domain_of(target)
                if domain is None or domain == own:
                    continue
                if target != f"kbflow.services.{domain}" or name not in public[domain]:
                    reached.append(f"{module}:{node.lineno} {target} {name or ''}".strip())
    assert not reached, f"imports past another domain's public names (its __all__): {reached}"
    for domain, names in public.items():
        package = importlib.import_module(f"kbflow.services.{domain}")
        for name in names:  # each public name resolves (a typo in _PUBLIC fails here)
            assert getattr(package, name) is not None
        stub = REPO / "kbflow" / "services" / domain / "__init__.pyi"
        typed = {
            alias.asname or alias.name: (node.module or "").removeprefix(package.__name__ + ".")
            for node in (ast.parse(stub.read_text()).body if stub.exists() else [])
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
        }
        declared = (
            {  # the stub names each from its module, as _PUBLIC does
                name: where.partition(":")[0] for name, where in package._PUBLIC.items()
            }
            if names
            else {}
        )
        for name, module in typed.items():
            typed[name] = name if module == package.__name__ else module
        assert typed == declared, f"{stub.relative_to(REPO)} and _PUBLIC differ"


def _payload_keys_read(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """String keys read (or set) on a chunk's payload, ``<x>.payload`` or a name ``payload``:
    ``[...]``, ``.get(...)``, ``.pop(...)``, ``in``; the fields ``iter_payloads`` names; and
    the keys the gate's conditions and the stores' filters (``FieldCondition``) test."""

    def is_payload(node: ast.expr) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "payload") or (
            isinstance(node, ast.Name) and node.id == "payload"
        )

    def literal(node: ast.expr) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        return None

    for node in ast.walk(tree):
        keys: list[ast.expr] = []
        if isinstance(node, ast.Subscript) and is_payload(node.value):
            keys = [node.slice]
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            on_payload = isinstance(func, ast.Attribute) and is_payload(func.value)
            if called in ("get", "pop", "setdefault") and on_payload and node.args:
                keys = [node.args[0]]
            elif called == "iter_payloads" and node.args and isinstance(node.args[0], ast.List):
                keys = list(node.args[0].elts)
            elif called in ("AnyOf", "NoneOf", "NotAfter") and node.args:  # the gate's
                keys = [node.args[0]]
            elif called == "FieldCondition":  # a store's own filters
                keys = [k.value for k in node.keywords if k.arg == "key"]
        elif isinstance(node, ast.Compare) and any(is_payload(c) for c in node.comparators):
            keys = [node.left]
        for key in keys:
            if (name := literal(key)) is not None:
                yield node.lineno, name


def test_every_payload_key_read_is_one_the_chunk_payload_declares() -> None:
    """A vector point's payload has one shape, `core.models.ChunkPayload` (issue 43): mypy
    checks what reaches it typed, and this the string keys code reads off a payload by name,
    which mypy lets through (``payload.get("typo")`` is an ``object``, not an error). A name
    ``payload`` is a chunk's; call another kind of payload something else."""
    from core.models import ChunkPayload
    from sinks.gate import GATED_DATETIME_FIELDS, GATED_KEYWORD_FIELDS

    declared = ChunkPayload.__required_keys__ | ChunkPayload.__optional_keys__
    indexed = {*GATED_KEYWORD_FIELDS, *GATED_DATETIME_FIELDS}
    assert indexed <= declared, f"payload indexes on undeclared keys: {indexed - declared}"
    unknown = [
        f"{path.relative_to(REPO)}:{line} {key!r}"
        for package in PRODUCT
        for path in sorted((REPO / package).rglob("*.py"))
        for line, key in _payload_keys_read(ast.parse(path.read_text(encoding="utf-8")))
        if key not in declared
    ]
    assert not unknown, f"payload keys ChunkPayload does not declare (declare or fix): {unknown}"

"""The shape of the house (issue 30): the app floor stands on few floors, its service layer has
one module per name, and no product file grows past 500 lines without saying why.

`tests/test_layers.py` holds the floors between packages; these rules hold ``kbflow/`` itself.
"""

from __future__ import annotations

from functools import cache

from tests.test_layers import REPO, modules_in, project_imports

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

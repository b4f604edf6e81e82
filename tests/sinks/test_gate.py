"""The approval gate: unit cases, a reference-predicate property, Edge congruence, one-place scan.

The gate is the platform's one invariant (docs/ARCHITECTURE.md): these tests check that
``Gate.admits`` says exactly what the architecture says, that the Qdrant Edge payload filter built
from the same gate returns exactly the points ``admits`` accepts on every query leg, and that no
other module builds a filter on a gated field.
"""

from __future__ import annotations

import ast
import datetime as dt
import functools
import random
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from core.models import ChunkPoint, Scope, SparseVec
from sinks.gate import (
    GATED_DATETIME_FIELDS,
    GATED_KEYWORD_FIELDS,
    Gate,
    build_gate,
    format_datetime,
    parse_datetime,
)
from sinks.registry import collection_ancestry
from sinks.vectors import DENSE_DIM, point_id_for

REPO = Path(__file__).resolve().parents[2]
TODAY = dt.date(2025, 6, 15)
YESTERDAY = TODAY - dt.timedelta(days=1)
TOMORROW = TODAY + dt.timedelta(days=1)
ORGS = ("acme", "globex")
STATUSES = ("approved", "pending_review", "rejected", "superseded")
PARSE_STATUSES = ("pending", "parsed", "ingested", "failed")
AUDIENCES = ("all", "internal", "partners")
COLLECTIONS = ("policies", "policies/hr", "handbook", "handbook/it", "policies-old")
ABSENT = object()  # marks a payload key that is left out entirely


def servable(**overrides: Any) -> dict[str, Any]:
    """A payload the default acme scope admits; ``ABSENT`` drops a key."""
    record: dict[str, Any] = {
        "org_id": "acme",
        "status": "approved",
        "parse_status": "ingested",
        "effective_date": format_datetime(YESTERDAY),
        "audience": "all",
        "collection_path": ["policies"],
    }
    record.update(overrides)
    return {k: v for k, v in record.items() if v is not ABSENT}


def acme(**kwargs: Any) -> Gate:
    return build_gate(Scope("acme", today=TODAY, **kwargs))


# --- unit cases -----------------------------------------------------------------------------


def test_servable_baseline_is_admitted() -> None:
    assert acme().admits(servable())


def test_other_org_is_rejected() -> None:
    assert not acme().admits(servable(org_id="globex"))
    assert not acme().admits(servable(org_id=ABSENT))
    assert build_gate(Scope("globex", today=TODAY)).admits(servable(org_id="globex"))


@pytest.mark.parametrize(
    ("status", "admitted"),
    [
        ("approved", True),
        (None, True),
        (ABSENT, True),
        ("pending_review", False),
        ("rejected", False),
        ("superseded", False),
    ],
)
def test_status(status: Any, admitted: bool) -> None:
    assert acme().admits(servable(status=status)) is admitted


@pytest.mark.parametrize(
    ("parse_status", "admitted"),
    [
        ("ingested", True),
        ("parsed", True),
        ("pending", False),
        ("failed", False),
        (None, False),
        (ABSENT, False),
    ],
)
def test_parse_status(parse_status: Any, admitted: bool) -> None:
    assert acme().admits(servable(parse_status=parse_status)) is admitted


@pytest.mark.parametrize(
    ("effective", "admitted"),
    [
        (TODAY, True),
        (TOMORROW, False),
        (YESTERDAY, True),
        (dt.datetime(2025, 6, 15, 0, 0, tzinfo=dt.UTC), True),
        (dt.datetime(2025, 6, 15, 23, 59, 59, 999999, tzinfo=dt.UTC), True),
        (dt.datetime(2025, 6, 16, 0, 0, tzinfo=dt.UTC), False),
        (dt.datetime(2025, 6, 15, 12, 0), True),  # naive: read as UTC
        ("2025-06-15T00:00:00Z", True),
        ("2025-06-15T23:59:59.999999Z", True),
        ("2025-06-16T00:00:00Z", False),
        ("2025-06-16T01:00:00+02:00", True),  # 2025-06-15T23:00Z
        ("2025-06-15", True),
        ("2025-06-16", False),
        (format_datetime(TODAY), True),
        (format_datetime(TOMORROW), False),
        (None, True),
        (ABSENT, True),
        ("not a date", False),
    ],
)
def test_effective_date(effective: Any, admitted: bool) -> None:
    assert acme().admits(servable(effective_date=effective)) is admitted


@pytest.mark.parametrize(
    ("audience", "scope_audiences", "admitted"),
    [
        ("all", (), True),
        (None, (), True),
        (ABSENT, (), True),
        ("internal", (), False),
        ("partners", (), False),
        ("internal", ("internal",), True),
        ("partners", ("internal",), False),
        ("partners", ("internal", "partners"), True),
        ("all", ("internal",), True),
    ],
)
def test_audience(audience: Any, scope_audiences: tuple[str, ...], admitted: bool) -> None:
    assert acme(audiences=scope_audiences).admits(servable(audience=audience)) is admitted


@pytest.mark.parametrize(
    ("path", "admitted"),
    [
        (["policies"], True),
        (["policies", "policies/hr"], True),
        (["handbook"], False),
        (["policies-old"], False),
        ([], False),
        (ABSENT, False),
    ],
)
def test_collections_restricted(path: Any, admitted: bool) -> None:
    gate = acme(collections=("policies",))
    assert gate.admits(servable(collection_path=path)) is admitted


@pytest.mark.parametrize("path", [["policies", "policies/hr"], ["handbook"], [], ABSENT])
def test_collections_unrestricted_admit_all(path: Any) -> None:
    assert acme(collections=None).admits(servable(collection_path=path))


def test_subcollection_scope_does_not_admit_parent() -> None:
    gate = acme(collections=("policies/hr",))
    assert gate.admits(servable(collection_path=collection_ancestry("policies/hr/leave")))
    assert not gate.admits(servable(collection_path=["policies"]))


def test_empty_collections_scope_admits_nothing() -> None:
    assert not acme(collections=()).admits(servable())


@pytest.mark.parametrize("org_id", ["", None])
def test_empty_org_raises(org_id: Any) -> None:
    with pytest.raises(ValueError, match="org_id"):
        build_gate(Scope(org_id))


def test_registry_shaped_record_is_admitted() -> None:
    """``DocRecord.gate_record`` gives dates as ``date`` and a collection ancestry list."""
    record = {
        "org_id": "acme",
        "status": None,
        "parse_status": "parsed",
        "effective_date": TODAY,
        "audience": None,
        "collection_path": collection_ancestry("policies/hr"),
    }
    assert acme(collections=("policies",)).admits(record)
    assert not acme().admits({**record, "effective_date": TOMORROW})


def test_empty_string_status_is_congruent_with_edge(edge_store: Any) -> None:
    gate = acme()
    payloads = [servable(status=""), servable(audience="")]
    points = [
        ChunkPoint(
            point_id=point_id_for(f"empty:{i}"),
            dense=unit_vectors(np.random.default_rng(i), 1)[0],
            sparse=SparseVec([0], [1.0]),
            payload={**p, "doc_id": f"empty{i}", "chunk_id": f"empty{i}:0"},
        )
        for i, p in enumerate(payloads)
    ]
    edge_store.upsert(points)
    hits = edge_store.query(gate, dense=points[0].dense, sparse=None, limit=10)
    returned = {h.point_id for h in hits}
    by_admits = {p.point_id for p in points if gate.admits(p.payload)}
    assert returned == by_admits


# --- property: admits() equals an independently written reference predicate ---------------


def reference_admits(record: Mapping[str, Any], scope: Scope) -> bool:
    """The invariant from docs/ARCHITECTURE.md, written without looking at sinks/gate.py."""
    if record.get("org_id") != scope.org_id:
        return False
    if record.get("status") not in (None, "approved"):
        return False
    if record.get("parse_status") not in ("ingested", "parsed"):
        return False
    effective = record.get("effective_date")
    if effective is not None and _utc_date(effective) > scope.today:
        return False
    audience = record.get("audience")
    if audience not in (None, "all") and audience not in scope.audiences:
        return False
    if scope.collections is not None:
        path = record.get("collection_path") or []
        if not any(c in path for c in scope.collections):
            return False
    return True


def _utc_date(value: dt.date | dt.datetime | str) -> dt.date:
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC)
        return value.date()
    return value


_DATE_FORMS = (
    lambda d: d,  # a date (registry rows)
    lambda d: dt.datetime.combine(d, dt.time(23, 59, 59, 999999), tzinfo=dt.UTC),
    lambda d: dt.datetime.combine(d, dt.time(0, 0), tzinfo=dt.UTC),
    format_datetime,  # the payload's RFC 3339 form
    lambda d: d.isoformat(),
)


@st.composite
def gate_payloads(draw: st.DrawFn) -> dict[str, Any]:
    """Random payloads over the gate's fields; a key may be missing altogether."""
    record: dict[str, Any] = {"org_id": draw(st.sampled_from(ORGS))}
    choices: dict[str, tuple[Any, ...]] = {
        "status": (*STATUSES, None, ABSENT),
        "parse_status": (*PARSE_STATUSES, ABSENT),
        "audience": (*AUDIENCES, ABSENT),
    }
    for key, values in choices.items():
        value = draw(st.sampled_from(values))
        if value is not ABSENT:
            record[key] = value
    day = draw(st.sampled_from((YESTERDAY, TODAY, TOMORROW, ABSENT)))
    if day is not ABSENT:
        assert isinstance(day, dt.date)
        record["effective_date"] = draw(st.sampled_from(_DATE_FORMS))(day)
    collection = draw(st.sampled_from((*COLLECTIONS, ABSENT)))
    if collection is not ABSENT:
        record["collection_path"] = collection_ancestry(str(collection))
    return record


scopes = st.builds(
    Scope,
    org_id=st.sampled_from(ORGS),
    today=st.sampled_from((YESTERDAY, TODAY, TOMORROW)),
    audiences=st.lists(st.sampled_from(AUDIENCES), max_size=3).map(tuple),
    collections=st.none()
    | st.lists(st.sampled_from((*COLLECTIONS, "nowhere")), max_size=3).map(tuple),
)


@hsettings(max_examples=400, derandomize=True, database=None, deadline=None)
@given(record=gate_payloads(), scope=scopes)
def test_admits_matches_reference_predicate(record: dict[str, Any], scope: Scope) -> None:
    assert build_gate(scope).admits(record) is reference_admits(record, scope)


# --- property: the Edge payload filter returns exactly what admits() accepts ---------------


def unit_vectors(rng: np.random.Generator, n: int) -> list[list[float]]:
    vectors = rng.normal(size=(n, DENSE_DIM))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return [v.tolist() for v in vectors]


SHARED_TERM = 0  # every point carries this sparse index, so a query on it can reach them all


def random_points(n: int, seed: int) -> list[ChunkPoint]:
    """Points with random gate payloads (payload form: RFC 3339 dates) and both vectors."""
    rng = np.random.default_rng(seed)
    pick = random.Random(seed)
    dense = unit_vectors(rng, n)
    points: list[ChunkPoint] = []
    for i in range(n):
        payload: dict[str, Any] = {"doc_id": f"doc{i % 97}", "chunk_id": f"doc{i % 97}:{i}"}
        payload["org_id"] = pick.choice(ORGS)
        # Servable values are drawn more often so that most scopes admit a good share.
        for key, values in (
            ("status", ("approved", "approved", *STATUSES, None, ABSENT)),
            ("parse_status", ("ingested", "parsed", *PARSE_STATUSES, ABSENT)),
            ("audience", ("all", *AUDIENCES, ABSENT)),
        ):
            value = pick.choice(values)
            if value is not ABSENT:
                payload[key] = value
        day = pick.choice((YESTERDAY, TODAY, TOMORROW, ABSENT))
        if isinstance(day, dt.date):
            time_of_day = pick.choice((dt.time(0, 0), dt.time(12, 30), dt.time.max))
            payload["effective_date"] = format_datetime(
                dt.datetime.combine(day, time_of_day, tzinfo=dt.UTC)
            )
        if pick.random() < 0.95:
            payload["collection_path"] = collection_ancestry(pick.choice(COLLECTIONS))
        term = int(rng.integers(1, 40))
        points.append(
            ChunkPoint(
                point_id=point_id_for(payload["chunk_id"]),
                dense=dense[i],
                sparse=SparseVec([SHARED_TERM, term], [float(rng.uniform(0.2, 1.0)), 1.0]),
                payload=payload,
            )
        )
    return points


def test_edge_filter_returns_exactly_what_the_gate_admits(edge_store: Any) -> None:
    points = random_points(300, seed=7)
    edge_store.upsert(points)
    limit = 1000  # above the point count: a complete answer is the admitted set itself
    everything = SparseVec([SHARED_TERM], [1.0])
    query_rng = np.random.default_rng(11)

    @hsettings(
        max_examples=25,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(scope=scopes, term=st.integers(1, 39))
    def check(scope: Scope, term: int) -> None:
        gate = build_gate(scope)
        expected = {p.point_id for p in points if reference_admits(p.payload, scope)}
        assert expected == {p.point_id for p in points if gate.admits(p.payload)}
        dense = unit_vectors(query_rng, 1)[0]
        legs = {
            "dense": edge_store.query(gate, dense=dense, sparse=None, limit=limit),
            "sparse": edge_store.query(gate, dense=None, sparse=everything, limit=limit),
            "hybrid": edge_store.query(
                gate, dense=dense, sparse=everything, limit=limit, prefetch_limit=limit
            ),
        }
        for leg, hits in legs.items():
            for hit in hits:
                assert gate.admits(hit.payload), (leg, hit.payload)
                assert reference_admits(hit.payload, scope), (leg, hit.payload)
            # Neither leaks (every hit admitted) nor over-hides (every admitted point found).
            assert {h.point_id for h in hits} == expected, leg
        one_term = edge_store.query(gate, dense=None, sparse=SparseVec([term], [1.0]), limit=limit)
        with_term = {p.point_id for p in points if term in p.sparse.indices}
        assert {h.point_id for h in one_term} == expected & with_term

    check()


def test_parse_datetime_reads_payload_form() -> None:
    when = dt.datetime(2025, 6, 15, 23, 59, 59, 999999, tzinfo=dt.UTC)
    assert parse_datetime(format_datetime(when)) == when
    assert format_datetime(TODAY) == "2025-06-15T00:00:00.000000Z"


# --- one place for the gate: no other module builds a filter on a gated field ---------------

SCANNED_PACKAGES = ("kbflow", "tasks", "flows", "sinks", "evals")
GATE_MODULE = "sinks/gate.py"
STORE_MODULES = ("sinks/qdrant_edge.py", "sinks/qdrant_server.py")
GATED_FIELDS = frozenset(
    {"org_id", "status", "parse_status", "audience", "collection_path", "effective_date"}
    | set(GATED_KEYWORD_FIELDS)
    | set(GATED_DATETIME_FIELDS)
)
# Filter constructors that name a payload field (qdrant_edge and qdrant_client spellings).
KEYED_CONDITIONS = frozenset(
    {"FieldCondition", "IsEmptyCondition", "IsNullCondition", "PayloadField", "NestedCondition"}
)
# Only the gate expresses "or absent" and date cut-offs; nobody else has a reason to.
GATE_ONLY_CALLS = frozenset(
    {"IsEmptyCondition", "IsNullCondition", "RangeDateTime", "DatetimeRange"}
)
_KEY_TEXT = re.compile(
    r"""\bkey\b["']?\s*[=:]\s*["'](?P<field>"""
    + "|".join(re.escape(f) for f in sorted(GATED_FIELDS))
    + r""")["']"""
)


@dataclass(frozen=True)
class FilterUse:
    path: str
    line: int
    function: str
    field: str | None
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} in {self.function or '<module>'}: {self.what}"


def _allowed(use: FilterUse) -> bool:
    if use.path == GATE_MODULE:
        return True
    if use.path in STORE_MODULES:
        # Document-level maintenance (set payload, delete, reviewer inspection) by doc_id.
        if use.field == "doc_id":
            return True
        # A per-tenant point count: returns a number, never a payload.
        if use.field == "org_id" and use.function.endswith("count"):
            return True
        # One org's points for copying between stores (export_points, delete_org): maintenance
        # paths that search never takes (tests/test_layers.py).
        if use.field == "org_id" and use.function == "_org_filter":
            return True
    return False


def _call_name(node: ast.Call) -> str:
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def _key_argument(node: ast.Call) -> ast.expr | None:
    for kw in node.keywords:
        if kw.arg == "key":
            return kw.value
    return node.args[0] if node.args else None


def _function_spans(tree: ast.Module) -> list[tuple[int, int, str]]:
    spans: list[tuple[int, int, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    spans.append((child.lineno, child.end_lineno or child.lineno, name))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return spans


def _enclosing(spans: list[tuple[int, int, str]], line: int) -> str:
    inside = [(end - start, name) for start, end, name in spans if start <= line <= end]
    return min(inside)[1] if inside else ""


def find_gate_filters(root: Path) -> list[FilterUse]:
    """Every place under ``root`` that builds a payload filter on a gated field."""
    uses: set[FilterUse] = set()
    for package in SCANNED_PACKAGES:
        for file in sorted((root / package).rglob("*.py")):
            rel = file.relative_to(root).as_posix()
            uses.update(_file_filters(rel, file.read_text(encoding="utf-8")))
    return sorted(uses, key=lambda u: (u.path, u.line, u.what))


@functools.lru_cache(maxsize=4096)
def _file_filters(rel: str, source: str) -> frozenset[FilterUse]:
    """The filter uses in one file's source (remembered by path and text: the injection tests
    scan a copy of the tree in which only one file differs)."""
    uses: set[FilterUse] = set()
    tree = ast.parse(source, filename=rel)
    spans = _function_spans(tree)

    def add(
        line: int,
        field: str | None,
        what: str,
        rel: str = rel,
        spans: list[tuple[int, int, str]] = spans,
    ) -> None:
        uses.add(FilterUse(rel, line, _enclosing(spans, line), field, what))

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _call_name(node)
            if name in GATE_ONLY_CALLS:
                add(node.lineno, None, f"{name}(...)")
            if name in KEYED_CONDITIONS:
                key = _key_argument(node)
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    if key.value in GATED_FIELDS:
                        add(node.lineno, key.value, f"{name}(key={key.value!r})")
                elif key is not None:
                    # A computed key could name any field; only the gate may do that.
                    add(node.lineno, None, f"{name}(key=<computed>)")
        elif isinstance(node, ast.Dict):
            # qdrant-client also takes filters as plain dicts: {"key": "status", ...}.
            for k, v in zip(node.keys, node.values, strict=True):
                if (
                    isinstance(k, ast.Constant)
                    and k.value == "key"
                    and isinstance(v, ast.Constant)
                    and v.value in GATED_FIELDS
                ):
                    add(node.lineno, str(v.value), f"{{'key': {v.value!r}}}")
    # Text fallback for spellings the AST walk misses (e.g. **{"key": ...}).
    for lineno, text in enumerate(source.splitlines(), start=1):
        for match in _KEY_TEXT.finditer(text):
            add(lineno, match["field"], f"text {match.group(0)!r}")
    return frozenset(uses)


def test_only_the_gate_builds_filters_on_gated_fields() -> None:
    offenders = [str(u) for u in find_gate_filters(REPO) if not _allowed(u)]
    assert not offenders, "filters on gated fields outside sinks/gate.py:\n" + "\n".join(offenders)


def test_the_scan_sees_the_gate_itself() -> None:
    """Guards against a scan that silently matches nothing (a renamed package, a bad regex)."""
    in_gate = [u for u in find_gate_filters(REPO) if u.path == GATE_MODULE]
    assert {u.what for u in in_gate} >= {
        "IsEmptyCondition(...)",
        "RangeDateTime(...)",
        "DatetimeRange(...)",
        "FieldCondition(key=<computed>)",
    }


INJECTED = {
    "status": 'FieldCondition(key="status", match=MatchValue("approved"))',
    "org_id": 'qm.FieldCondition(key="org_id", match=qm.MatchValue(value=org))',
    "effective": 'qe.FieldCondition(key="effective_date", range=qe.RangeDateTime(lte=x))',
    "dict": '{"key": "audience", "match": {"value": "all"}}',
    "is_empty": 'qe.IsEmptyCondition(key="parse_status")',
    "computed": "qe.FieldCondition(key=field, match=qe.MatchAny(values))",
    "payload_field": 'qm.IsEmptyCondition(is_empty=qm.PayloadField(key="status"))',
    "doc_id_outside_store": 'qe.FieldCondition(key="doc_id", match=qe.MatchValue(doc))',
    "unpacked": '_mk(**{"key" : "collection_path"})',
}


@pytest.mark.parametrize(
    "target",
    ["tasks/query/retrieve.py", "kbflow/services/query/context.py", "sinks/registry/documents.py"],
)
@pytest.mark.parametrize("snippet", list(INJECTED.values()), ids=list(INJECTED))
def test_the_scan_catches_an_injected_filter(tmp_path: Path, target: str, snippet: str) -> None:
    """A copy of the real tree with one filter added elsewhere must fail the scan."""
    for package in SCANNED_PACKAGES:
        if (REPO / package).is_dir():
            shutil.copytree(
                REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")
            )
    assert not [u for u in find_gate_filters(tmp_path) if not _allowed(u)]
    victim = tmp_path / target
    victim.write_text(
        victim.read_text(encoding="utf-8") + f"\n\ndef _sneaky(*a, **k):\n    return {snippet}\n",
        encoding="utf-8",
    )
    offenders = [u for u in find_gate_filters(tmp_path) if not _allowed(u)]
    assert offenders
    assert all(u.path == target and u.function == "_sneaky" for u in offenders)


def test_the_scan_still_flags_status_in_store_modules(tmp_path: Path) -> None:
    """The store allowance is for doc_id (and the org count) only, not for status filters."""
    store = tmp_path / "sinks" / "qdrant_edge.py"
    store.parent.mkdir(parents=True)
    store.write_text(
        "def count(org):\n"
        '    a = FieldCondition(key="org_id", match=MatchValue(org))\n'
        '    return FieldCondition(key="status", match=MatchValue("approved"))\n'
        "def hidden(org):\n"
        '    return FieldCondition(key="org_id", match=MatchValue(org))\n',
        encoding="utf-8",
    )
    offenders = {(u.line, u.field) for u in find_gate_filters(tmp_path) if not _allowed(u)}
    assert offenders == {(3, "status"), (5, "org_id")}

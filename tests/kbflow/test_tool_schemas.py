"""The agent tools' schemas, now generated from pydantic models, say what the hand-written ones
said (``tool_schemas_v1.json``, recorded before the models replaced them).

Two checks per schema: the structure is the same keyword for keyword (properties, types,
required, bounds, enums, defaults, additionalProperties, descriptions), and a corpus of argument
and result objects gets the same accept / reject verdict from both under jsonschema — with
`call_tool`'s strict validator for the arguments (no bool or 5.0 for an integer) and the plain
one for results, as `call_tool` uses them. No embedder or database here: schemas only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from kbflow.services.query.tools import TOOLS, _strict_validator, export_schemas

V1 = {
    t["name"]: t
    for t in json.loads((Path(__file__).parent / "tool_schemas_v1.json").read_text("utf-8"))
}
SCHEMAS = ("input_schema", "output_schema")


def _normal(schema: Any) -> Any:
    """The schema with its order-free parts as sets: "required", "enum" and a list "type"."""
    if isinstance(schema, list):
        return [_normal(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in ("required", "enum") or (key == "type" and isinstance(value, list)):
            out[key] = frozenset(value)
        elif key == "properties":
            out[key] = {name: _normal(sub) for name, sub in value.items()}
        else:
            out[key] = _normal(value)
    return out


def _differences(old: Any, new: Any, where: str = "") -> list[str]:
    """Where two normalised schemas part, as JSON-pointer-ish paths (for a readable failure)."""
    if isinstance(old, dict) and isinstance(new, dict):
        found = []
        for key in sorted(old.keys() | new.keys()):
            if key not in new:
                found.append(f"{where}/{key}: dropped (was {old[key]!r})")
            elif key not in old:
                found.append(f"{where}/{key}: added ({new[key]!r})")
            else:
                found += _differences(old[key], new[key], f"{where}/{key}")
        return found
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [
            d
            for i, (o, n) in enumerate(zip(old, new, strict=True))
            for d in _differences(o, n, f"{where}/{i}")
        ]
    return [] if old == new else [f"{where or '/'}: {old!r} became {new!r}"]


# Keys added since v1, each optional and where v1 let other keys through (no
# "additionalProperties": false above it): what a v1 client accepted, it still accepts.
ADDED: dict[tuple[str, str], set[str]] = {
    ("search_knowledge_base", "output_schema"): {"/properties/results/items/properties/sources"},
    ("research_knowledge_search", "output_schema"): {
        "/properties/citations/items/properties/sources"
    },
}


@pytest.mark.parametrize("name", list(V1))
@pytest.mark.parametrize("kind", SCHEMAS)
def test_the_generated_schema_says_what_the_hand_written_one_said(name: str, kind: str) -> None:
    new = getattr(TOOLS[name], kind)
    found = _differences(_normal(V1[name][kind]), _normal(new))
    added = ADDED.get((name, kind), set())
    assert sorted(d for d in found if d.split(": ")[0] not in added) == []
    assert {d.split(": ")[0] for d in found} == added
    for path in added:
        *parent, _, key = path.strip("/").split("/")
        node = V1[name][kind]
        for step in parent:
            node = node[step]
        assert node.get("additionalProperties") is not False, path
        assert key not in node.get("required", []), path


def _keywords(schema: Any) -> set[str]:
    """Every keyword used anywhere in the schema (property names are not keywords)."""
    if isinstance(schema, list):
        return set().union(*(_keywords(item) for item in schema))
    if not isinstance(schema, dict):
        return set()
    found = set(schema)
    for key, value in schema.items():
        subs = value.values() if key == "properties" else [value]
        found |= set().union(*(_keywords(sub) for sub in subs))
    return found


def test_every_tool_is_exported_and_every_schema_is_valid_json_schema() -> None:
    exported = export_schemas()
    assert [t["name"] for t in exported] == list(V1)
    for tool in exported:
        assert tool["description"] == V1[tool["name"]]["description"]
        for kind in SCHEMAS:
            schema = tool[kind]
            jsonschema.validators.validator_for(schema).check_schema(schema)
            # Plain and self-contained, for LLM tool-use APIs: no references, no titles.
            assert not {"$ref", "$defs", "title"} & _keywords(schema), (tool["name"], kind)


# --- the verdict corpus ----------------------------------------------------------------------

LONE_SURROGATE = "\udce9"  # what surrogateescape makes of a Latin-1 byte: valid to jsonschema

ARGUMENTS: dict[str, list[Any]] = {
    "list_knowledge_collections": [
        {},
        {"query": "x"},
        {"agent_id": "hr-bot"},
        {"": None},
        [],
        None,
        "",
        "{}",
        0,
        True,
        {"collection_id": 1},
        {"top_k": 5},
        {"extra": {}},
        {"queries": ["x"]},
        [{}],
    ],
    "search_knowledge_base": [
        {"query": "expenses"},
        {"query": "x", "top_k": 1},
        {"query": "x", "top_k": 50},
        {"query": "x", "top_k": 0},
        {"query": "x", "top_k": 51},
        {"query": "x", "top_k": -3},
        {"query": "x", "top_k": 5.0},
        {"query": "x", "top_k": 5.5},
        {"query": "x", "top_k": True},
        {"query": "x", "top_k": "5"},
        {"query": "x", "top_k": None},
        {"query": "x", "collection_id": 3},
        {"query": "x", "collection_id": None},
        {"query": "x", "collection_id": 0},
        {"query": "x", "collection_id": -1},
        {"query": "x", "collection_id": "3"},
        {"query": "x", "collection_id": False},
        {"query": "x", "collection_id": 3.0},
        {"query": "x", "collection_id": 3, "top_k": 10},
        {"query": ""},
        {"query": " "},
        {"query": None},
        {"query": ["x"]},
        {"query": 7},
        {"query": "é" * 10_000},
        {"query": LONE_SURROGATE},
        {},
        {"top_k": 5},
        {"query": "x", "colection_id": 3},
        {"query": "x", "queries": ["x"]},
        [],
        "x",
        None,
    ],
    "research_knowledge_search": [
        {"queries": ["x"]},
        {"queries": ["a", "b", "c", "d", "e"]},
        {"queries": ["a", "b", "c", "d", "e", "f"]},
        {"queries": []},
        {"queries": [""]},
        {"queries": ["x", ""]},
        {"queries": [" "]},
        {"queries": ["x", "x"]},
        {"queries": "x"},
        {"queries": None},
        {"queries": [1]},
        {"queries": [None]},
        {"queries": [["x"]]},
        {"queries": [True]},
        {"queries": {"0": "x"}},
        {"queries": [LONE_SURROGATE]},
        {},
        {"query": "x"},
        {"queries": ["x"], "top_k": 5},
        {"queries": ["x"], "extra": None},
        [],
        None,
    ],
}

_COLLECTION = {"id": 1, "name": "hr", "description": "People.", "parent_id": None}
_HIT = {
    "doc_id": "d",
    "chunk_id": "c",
    "title": "T",
    "uri": "file:///t.md",
    "collection": "policies/hr",
    "heading_path": ["A", "B"],
    "location": {"page": 3},
    "text": "text",
    "score": 0.5,
}
_SEARCH = {
    "agent": "hr-bot",
    "query": "x",
    "collection_id": None,
    "results": [_HIT],
    "kb_context_provided": True,
    "degraded": False,
    "paused": False,
    "note": None,
}
_CITATION = {"chunk_id": "c", "doc_id": "d", "uri": "u", "title": "T", "quote": "q"}
_RESEARCH = {
    "turn_id": "t",
    "answer_status": "maybe",
    "steering": "use it",
    "synthesis": "s",
    "citations": [_CITATION],
    "miss": {"reason": "gap", "detail": "no source on x"},
}


def _without(obj: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k != key}


def _hit(**changes: Any) -> dict[str, Any]:
    return {**_SEARCH, "results": [{**_HIT, **changes}]}


def _cite(**changes: Any) -> dict[str, Any]:
    return {**_RESEARCH, "citations": [{**_CITATION, **changes}]}


RESULTS: dict[str, list[Any]] = {
    "list_knowledge_collections": [
        {"agent": "a", "knowledge_base_enabled": True, "collections": [_COLLECTION]},
        {"agent": "a", "knowledge_base_enabled": False, "collections": []},
        {
            "agent": "a",
            "knowledge_base_enabled": True,
            "collections": [{**_COLLECTION, "parent_id": 2}],
        },
        {"agent": "a", "knowledge_base_enabled": 1, "collections": []},
        {"agent": None, "knowledge_base_enabled": True, "collections": []},
        {"agent": "a", "knowledge_base_enabled": True},
        {"agent": "a", "knowledge_base_enabled": True, "collections": [], "note": None},
        {
            "agent": "a",
            "knowledge_base_enabled": True,
            "collections": [_without(_COLLECTION, "description")],
        },
        {
            "agent": "a",
            "knowledge_base_enabled": True,
            "collections": [{**_COLLECTION, "path": "hr"}],
        },
        {"agent": "a", "knowledge_base_enabled": True, "collections": [{**_COLLECTION, "id": "1"}]},
        {
            "agent": "a",
            "knowledge_base_enabled": True,
            "collections": [{**_COLLECTION, "parent_id": "p"}],
        },
        {"agent": "a", "knowledge_base_enabled": True, "collections": [{**_COLLECTION, "id": 1.5}]},
        {"agent": "a", "knowledge_base_enabled": True, "collections": _COLLECTION},
        {},
        [],
    ],
    "search_knowledge_base": [
        _SEARCH,
        {**_SEARCH, "results": [], "note": "the knowledge base is switched off"},
        {**_SEARCH, "collection_id": 3},
        _without(_SEARCH, "collection_id"),
        _without(_SEARCH, "note"),
        _without(_SEARCH, "results"),
        _without(_SEARCH, "paused"),
        {**_SEARCH, "extra": 1},
        {**_SEARCH, "degraded": "no"},
        {**_SEARCH, "note": 3},
        {**_SEARCH, "collection_id": "3"},
        {**_SEARCH, "results": [_without(_HIT, "heading_path")]},
        {**_SEARCH, "results": [_without(_HIT, "location")]},
        {**_SEARCH, "results": [_without(_HIT, "score")]},
        _hit(location=None),
        _hit(location=[1]),
        _hit(heading_path="A"),
        _hit(heading_path=[1]),
        _hit(score=1),
        _hit(score="0.5"),
        _hit(text=None),
        _hit(anything="else"),
    ],
    "research_knowledge_search": [
        _RESEARCH,
        {**_RESEARCH, "answer_status": "yes", "miss": None},
        {**_RESEARCH, "answer_status": "no", "citations": []},
        {**_RESEARCH, "answer_status": "perhaps"},
        {**_RESEARCH, "answer_status": None},
        {**_RESEARCH, "answer_status": 1},
        _without(_RESEARCH, "miss"),
        _without(_RESEARCH, "steering"),
        {**_RESEARCH, "miss": {"reason": "gap"}},
        {**_RESEARCH, "miss": {"reason": "gap", "detail": 1}},
        {**_RESEARCH, "miss": "gap"},
        {**_RESEARCH, "miss": {"reason": "gap", "detail": "d", "extra": 1}},
        {**_RESEARCH, "extra": 1},
        _cite(title=None),
        _cite(quote=1),
        {**_RESEARCH, "citations": [_without(_without(_CITATION, "title"), "quote")]},
        {**_RESEARCH, "citations": [_without(_CITATION, "uri")]},
        _cite(extra=1),
        {**_RESEARCH, "citations": "c"},
        {**_RESEARCH, "turn_id": 5},
    ],
}


@pytest.mark.parametrize("name", list(V1))
def test_arguments_get_the_same_verdict_from_both_schemas(name: str) -> None:
    old, new = (_strict_validator(s) for s in (V1[name]["input_schema"], TOOLS[name].input_schema))
    verdicts = [(args, old.is_valid(args), new.is_valid(args)) for args in ARGUMENTS[name]]
    assert [v for v in verdicts if v[1] != v[2]] == []
    assert {v[1] for v in verdicts} == {True, False}, "the corpus must hold both verdicts"


@pytest.mark.parametrize("name", list(V1))
def test_results_get_the_same_verdict_from_both_schemas(name: str) -> None:
    old_schema, new_schema = V1[name]["output_schema"], TOOLS[name].output_schema
    old = jsonschema.validators.validator_for(old_schema)(old_schema)
    new = jsonschema.validators.validator_for(new_schema)(new_schema)
    verdicts = [(result, old.is_valid(result), new.is_valid(result)) for result in RESULTS[name]]
    assert [v for v in verdicts if v[1] != v[2]] == []
    assert {v[1] for v in verdicts} == {True, False}, "the corpus must hold both verdicts"

"""The agent tools' contracts: each tool's arguments and result as a pydantic model.

`tool_schema(Model)` is the JSON Schema the tool publishes
(`kbflow.services.query.tools.export_schemas`, `kbflow
tools schema`) and `call_tool` validates against: plain and self-contained, because LLM tool-use
APIs take it as it is — no ``$ref`` or ``$defs`` (some APIs refuse them), no titles (the names
say it), and ``"type": ["integer", "null"]`` for a value that may be null. The models carry every
bound, enum, default and "no other keys" (``extra="forbid"``) that the schema states;
``tests/kbflow/tool_schemas_v1.json`` holds the hand-written schemas they replaced, and
``tests/kbflow/test_tool_schemas.py`` keeps the two equivalent.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, JsonSchemaValue, NoDefault
from pydantic_core import CoreSchema, core_schema

from kbflow.services.query.types import JsonSchema

MAX_TOP_K = 50
DEFAULT_TOP_K = 5
MAX_RESEARCH_QUERIES = 5


# --- list_knowledge_collections --------------------------------------------------------------


class ListInput(BaseModel):
    """No arguments: the agent's identity says what it may read."""

    model_config = ConfigDict(extra="forbid")


class CollectionOut(BaseModel):
    """One collection the agent may read; ``parent_id`` is None at the top of the tree."""

    model_config = ConfigDict(extra="forbid")

    id: int
    name: str
    description: str
    parent_id: int | None


class ListOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent: str
    knowledge_base_enabled: bool
    collections: list[CollectionOut]


# --- search_knowledge_base -------------------------------------------------------------------


class SearchInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, description="What to look for.")
    collection_id: int | None = Field(
        None,
        description="Search only this collection (and its sub-collections); "
        "omit to search every collection the agent may read.",
    )
    top_k: int = Field(DEFAULT_TOP_K, ge=1, le=MAX_TOP_K)


class SourceOut(BaseModel):
    """A source that a citation tag in the text stands for (``[doc:<id>]``, ``[url:…]``,
    ``[search:…]``), as the cited document's Citations footer names it."""

    tag: str = Field(description="The tag as it stands in the text, brackets included.")
    title: str
    uri: str | None = Field(description="Where the source is, when known.")


class SearchHitOut(BaseModel):
    """One cited passage. Other keys are let through: the schema never forbade them."""

    doc_id: str
    chunk_id: str
    title: str
    uri: str
    collection: str
    # Optional, and a factory default is not published: the schema says "may be left out".
    heading_path: list[str] = Field(default_factory=list)
    location: dict[str, Any] | None = None
    text: str
    score: float
    sources: list[SourceOut] = Field(
        default_factory=list,
        description="What the citation tags in the text stand for (may be left out).",
    )


class SearchOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent: str
    query: str
    collection_id: int | None = None
    results: list[SearchHitOut]
    kb_context_provided: bool
    degraded: bool
    paused: bool
    note: str | None = None


# --- research_knowledge_search ---------------------------------------------------------------


class ResearchInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    queries: list[Annotated[str, Field(min_length=1)]] = Field(
        min_length=1,
        max_length=MAX_RESEARCH_QUERIES,
        description="1 to 5 research queries about one need.",
    )


class CitationOut(BaseModel):
    chunk_id: str
    doc_id: str
    uri: str
    title: str = Field(default_factory=str)
    quote: str = Field(default_factory=str)
    sources: list[SourceOut] = Field(
        default_factory=list,
        description="What the citation tags in the cited chunk stand for (may be left out).",
    )


class MissOut(BaseModel):
    """Why the knowledge base could not answer (``answer_status`` "no" or "maybe")."""

    reason: str
    detail: str


class ResearchOutput(BaseModel):
    """What `kbflow.services.query.answers.ask` returns; keys beyond these are let through, as they
    always were."""

    turn_id: str
    answer_status: Literal["yes", "maybe", "no"]
    steering: str
    synthesis: str
    citations: list[CitationOut]
    miss: MissOut | None


# --- the published schema --------------------------------------------------------------------

# Keywords that constrain whatever the value is, null included: an ``anyOf`` branch holding one
# cannot merge with its null branch into ``"type": [X, "null"]``.
_EVERY_TYPE = frozenset({"enum", "const", "$ref", "anyOf", "oneOf", "allOf", "not", "if"})


class _PlainSchema(GenerateJsonSchema):
    """pydantic's JSON Schema, trimmed to what an LLM tool-use API takes and a reader needs."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def model_schema(self, schema: core_schema.ModelSchema) -> JsonSchemaValue:
        # No title, and no docstring as a description: the docstrings here are for the reader
        # of this file, the agent reads the tool's description and the fields'.
        json_schema = super().model_schema(schema)
        json_schema.pop("title", None)
        json_schema.pop("description", None)
        return json_schema

    def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
        # A None default is how a model says "may be left out"; JSON Schema says that by leaving
        # the name out of "required", and a published `"default": null` invites a null.
        default = super().get_default_value(schema)
        return NoDefault if default is None else default

    def literal_schema(self, schema: core_schema.LiteralSchema) -> JsonSchemaValue:
        # The enum alone, as the tools always published it: its values say their type.
        json_schema = super().literal_schema(schema)
        if "enum" in json_schema:
            json_schema.pop("type", None)
        return json_schema

    def dict_schema(self, schema: core_schema.DictSchema) -> JsonSchemaValue:
        # `dict[str, Any]` is any object: "additionalProperties": true is the default anyway.
        json_schema = super().dict_schema(schema)
        if json_schema.get("additionalProperties") is True:
            del json_schema["additionalProperties"]
        return json_schema

    def generate(self, schema: CoreSchema, mode: JsonSchemaMode = "validation") -> JsonSchemaValue:
        json_schema = super().generate(schema, mode)
        definitions = json_schema.pop("$defs", {})
        return self.sort(_plain(json_schema, definitions, ()))


def _plain(node: Any, definitions: dict[str, Any], inlining: tuple[str, ...]) -> Any:
    """``node`` with each ``$ref`` replaced by its definition, and each ``anyOf`` of one type and
    null merged into ``"type": [X, "null"]`` (the same values pass: every other keyword on X
    applies to X's values only)."""
    if isinstance(node, list):
        return [_plain(item, definitions, inlining) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        name = node["$ref"].removeprefix("#/$defs/")
        if name in inlining:
            raise ValueError(f"a tool schema cannot be inlined: {name} refers to itself")
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        node = {**definitions[name], **siblings}
        inlining = (*inlining, name)
    out = {key: _plain(value, definitions, inlining) for key, value in node.items()}
    branches = out.get("anyOf")
    if isinstance(branches, list) and len(branches) == 2 and {"type": "null"} in branches:
        (other,) = [b for b in branches if b != {"type": "null"}]
        if isinstance(other.get("type"), str) and not _EVERY_TYPE & other.keys():
            siblings = {k: v for k, v in out.items() if k != "anyOf"}
            out = {**siblings, **other, "type": [other["type"], "null"]}
    return out


def tool_schema(model: type[BaseModel]) -> JsonSchema:
    """The plain JSON Schema of a tool's arguments or result (see the module's docstring)."""
    return model.model_json_schema(schema_generator=_PlainSchema)

"""Query: what an agent or a person asks of an org's approved knowledge.

Owns the open `context.OpenHome` every query takes (settings, registry, vector store,
embedder), gated `search` (the one function every search reaches), cited `answers`, the
knowledge search, replay and provenance, and the agent's `tools` (their schemas in
`tool_models`); the JSON they return, as typed dicts (`types`). Nothing here starts Prefect.
"""

from core.lazy import public_names

_PUBLIC = {  # what other domains may import from here, and the module that holds it
    "OpenHome": "context",
    "store_opener": "context",
}
__all__ = sorted(_PUBLIC)
__getattr__ = public_names(__name__, _PUBLIC)

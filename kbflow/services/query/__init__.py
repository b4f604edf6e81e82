"""Query: what an agent or a person asks of an org's approved knowledge.

Owns the open `context.SearchContext` every query takes (settings, registry, vector store,
embedder), gated `search` (the one function every search reaches), cited `answers`, the
knowledge search, replay and provenance, and the agent's `tools` (their schemas in
`tool_models`). Nothing here starts Prefect.
"""

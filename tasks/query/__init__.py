"""The query path: gated hybrid retrieval, its keyword fallback over the registry, and reranking.
Imports no Prefect."""

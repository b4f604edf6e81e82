"""The research pipeline: the AM's seed bundle, the research corpus, SSRF-guarded public
fetches under a budget, synthesis of the four drafts, and persisting them for review."""

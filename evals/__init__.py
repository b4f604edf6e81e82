"""Evaluations: extraction quality against reference text, retrieval quality on benchmarks."""

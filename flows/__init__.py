"""Prefect flows: thin DAGs that compose tasks. One flow per file, named like its deployment."""

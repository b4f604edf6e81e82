"""The AM seed bundle: limits checked before anything is stored, tagged documents, hidden from
agents, listed for reviewers, idempotent re-seeding."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from core.errors import ConfigError, UnsafeUrl
from core.models import Scope, SearchMode
from tasks.ingest.extract import file_to_document
from tasks.query.retrieve import search
from tasks.research.seed import (
    MAX_SEED_FILE_BYTES,
    MAX_SEED_URLS,
    SEED_AUDIENCE,
    SeedBundle,
    list_seeds,
    seed_bundle,
)

ORG = "fresh"


def _extract(source: Any) -> Any:
    return file_to_document(source.path)


@pytest.fixture
def ctx(edge_store: Any, registry: Any, embedder: Any) -> dict[str, Any]:
    registry.people.ensure_org(ORG, "Fresh Foods")
    return {"store": edge_store, "registry": registry, "embedder": embedder}


def _seed(ctx: dict[str, Any], bundle: SeedBundle) -> Any:
    return seed_bundle(bundle, ORG, extract_file=_extract, **ctx)


def test_seeded_inputs_are_tagged_listed_and_hidden_from_agents(
    ctx: dict[str, Any], tmp_path: Path
) -> None:
    brief = tmp_path / "brief.md"
    brief.write_text("# Brand\n\nFresh Foods speaks warmly and plainly to busy parents.\n")
    bundle = SeedBundle(
        files=(brief,),
        urls=("https://fresh-foods.example/",),
        prompts=("Focus on the new organic baby food line.",),
    )
    report = _seed(ctx, bundle)
    assert report.documents == 3 and not report.skipped
    seeds = list_seeds(ctx["registry"], ORG)
    assert sorted(d.source_tag for d in seeds) == ["am_file", "am_prompt", "am_url"]
    assert all(d.audience == SEED_AUDIENCE for d in seeds)
    for mode in SearchMode:
        assert search("busy parents organic baby food", Scope(org_id=ORG), mode=mode, **ctx) == []
    # Never served, whatever the audience: reviewers read seeds through `review show`.
    for scope in (Scope(org_id=ORG, audiences=(SEED_AUDIENCE,)), Scope(ORG, all_audiences=True)):
        for mode in SearchMode:
            assert search("busy parents organic baby food", scope, mode=mode, **ctx) == []
    again = _seed(ctx, bundle)
    assert again.documents == 0  # unchanged inputs are not stored twice


@pytest.mark.parametrize(
    ("bundle_kind", "message"),
    [
        ("empty", "seed bundle is empty"),
        ("too_many", "at most 20 files"),
        ("too_big", "the limit is 25 MiB"),
        ("missing", "does not exist"),
        ("bad_url", r"not an http\(s\) URL"),
        ("file_url", r"not an http\(s\) URL"),
        ("blank_prompt", "prompt is empty"),
        # The fetch's own rules, when the URL is stored (not only when research fetches it).
        ("metadata_url", "cloud metadata endpoint"),
        ("private_url", "private address"),
        ("credentials_url", "carries credentials"),
        ("local_name_url", "blocked host name"),
        ("too_many_urls", "at most 20 URLs"),
    ],
)
def test_bad_bundles_store_nothing(
    ctx: dict[str, Any], tmp_path: Path, bundle_kind: str, message: str
) -> None:
    ok = tmp_path / "ok.md"
    ok.write_text("# ok\n\ntext\n")
    big = tmp_path / "big.txt"
    with big.open("wb") as fh:
        fh.truncate(MAX_SEED_FILE_BYTES + 1)
    bundles = {
        "empty": SeedBundle(),
        "too_many": SeedBundle(files=(ok,) * 21),
        "too_big": SeedBundle(files=(ok, big)),
        "missing": SeedBundle(files=(tmp_path / "nope.md",)),
        "bad_url": SeedBundle(files=(ok,), urls=("fresh-foods.example",)),
        "file_url": SeedBundle(urls=("file:///etc/passwd",)),
        "blank_prompt": SeedBundle(files=(ok,), prompts=("  ",)),
        "metadata_url": SeedBundle(urls=("http://169.254.169.254/latest/meta-data/",)),
        "private_url": SeedBundle(prompts=("p",), urls=("http://10.1.2.3/wiki",)),
        "credentials_url": SeedBundle(urls=("https://user:secret@fresh-foods.example/",)),
        "local_name_url": SeedBundle(urls=("http://localhost:8080/admin",)),
        "too_many_urls": SeedBundle(
            urls=tuple(f"https://fresh-foods.example/p{i}" for i in range(MAX_SEED_URLS + 1))
        ),
    }
    with pytest.raises((ConfigError, UnsafeUrl), match=message):
        _seed(ctx, bundles[bundle_kind])
    assert ctx["registry"].documents.list_documents(ORG) == []
    assert ctx["store"].count() == 0

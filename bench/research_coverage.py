"""Research fact coverage: how many facts of a seed bundle land in the right draft, cited.

Each bundle of `evals.research_coverage` (``cider``: a cider maker's brand guide, product sheet,
legal notes, contacts CSV and call notes, 39 expected facts; ``physio``: a clinic's HTML price
list, team page and legal bullets, 23 facts) is seeded into its own org of a fresh
``KBFLOW_HOME`` the way ``kbflow seed`` stores it (files extracted in the isolated worker,
`tasks.research.seed.seed_bundle`), then research runs offline through the functions the
``research`` flow's tasks call (`tasks.research.run.run_research`: gather the corpus with no
public context, synthesize, validate, persist the four drafts as pending_review), with:

- ``extractive``: `ExtractiveSynthesizer` on MiniLM, what ``kbflow research`` uses with no
  ``ANTHROPIC_API_KEY``;
- ``claude-scripted`` (cider only): `AnthropicSynthesizer` through the real Anthropic SDK on
  an ``httpx2.MockTransport`` that answers with the bundle's scripted reply
  (``evals/research_bundles/cider/claude_reply.md``). Its figure measures kbflow's handling of
  such a reply (parsing, validation, citations, persistence), NOT the quality of Claude's
  writing.

Per path: facts in the right draft, facts there AND cited to the seed that holds them, and
cited facts whose citation is kept in the persisted draft's citations metadata (the footer,
resolved to the seed's URI). Prints a Markdown table and saves
bench/results/research_coverage.json.

Usage: ``.venv/bin/python bench/research_coverage.py [--home DIR] [--drafts DIR]`` (a
temporary home by default; ``--drafts`` writes each path's four drafts there to read). No
network and no dataset needed; under a minute on two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.stats import save_results  # noqa: E402


def _claude(script: str, requests: list[dict[str, Any]]) -> Any:
    """An `AnthropicSynthesizer` whose HTTP is answered by ``script`` (real SDK, no network)."""
    import anthropic
    import httpx2

    from tasks.research.claude import AnthropicSynthesizer

    def handle(request: Any) -> Any:
        requests.append(json.loads(request.content))
        return httpx2.Response(
            200,
            json={
                "id": "msg_bench",
                "type": "message",
                "role": "assistant",
                "model": "claude-haiku-4-5",
                "content": [{"type": "text", "text": script}],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": 0, "output_tokens": 0},
            },
        )

    client = anthropic.Anthropic(
        api_key="bench", http_client=httpx2.Client(transport=httpx2.MockTransport(handle))
    )
    return AnthropicSynthesizer("unused", client=client, max_retries=0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--home", type=Path, help="KBFLOW_HOME to use (default: a temp dir)")
    parser.add_argument("--drafts", type=Path, help="also write each path's drafts under DIR")
    args = parser.parse_args()
    home = args.home or Path(tempfile.mkdtemp(prefix="kbflow-research-bench-"))
    os.environ["KBFLOW_HOME"] = str(home)
    os.environ.pop("ANTHROPIC_API_KEY", None)
    try:
        out = run(home, args.drafts)
    finally:
        if args.home is None:
            shutil.rmtree(home, ignore_errors=True)
    print("| bundle/path | facts | in the right draft | and cited to their seed | citation kept |")
    print("|---|---|---|---|---|")
    for name, row in out["paths"].items():
        print(
            f"| {name} | {row['facts']} | {row['found']} ({row['found_ratio']:.1%}) "
            f"| {row['cited']} ({row['cited_ratio']:.1%}) | {row['citation_kept']} |"
        )
    for name, row in out["paths"].items():
        if row["missing"]:
            print(f"{name}: not in the right draft or not cited: {', '.join(row['missing'])}")
    print("claude-scripted measures kbflow's handling of a scripted reply, not Claude's quality.")
    save_results("research_coverage", out, unprinted="paths")
    return 0


def run(home: Path, drafts_dir: Path | None = None) -> dict[str, Any]:
    from core.models import ResearchRequest
    from core.settings import Settings
    from evals.research_coverage import CIDER, PHYSIO, score_drafts, scripted_reply
    from sinks.connect import open_registry, open_vector_store
    from tasks.ingest.isolate import isolated_extractor
    from tasks.research.extractive import ExtractiveSynthesizer
    from tasks.research.run import run_research
    from tasks.research.seed import SeedBundle, list_seeds, seed_bundle
    from tasks.text.embed import embedder_for

    settings = Settings(home=home)
    embedder = embedder_for(settings)
    paths: dict[str, Any] = {}
    bundles: dict[str, Any] = {}
    with open_registry(settings) as registry, open_vector_store(settings, share=False) as store:
        for bundle in (CIDER, PHYSIO):
            org = bundle.name
            registry.ensure_org(org, bundle.client_name)
            with isolated_extractor(settings) as extract:
                seeded = seed_bundle(
                    SeedBundle(files=tuple(bundle.seed_files())), org, registry=registry,
                    store=store, embedder=embedder, extract_file=extract,
                )  # fmt: skip
            seeds = list_seeds(registry, org)
            seed_cites = {Path(d.uri).name: f"doc:{d.id}" for d in seeds}
            titles = {f"doc:{d.id}": d.title for d in seeds}
            facts = bundle.facts()
            bundles[bundle.name] = {
                "client": bundle.client_name,
                "seeds": sorted(seed_cites),
                "stored": seeded.documents,
                "facts": len(facts),
            }
            requests: list[dict[str, Any]] = []
            synthesizers: dict[str, Any] = {"extractive": ExtractiveSynthesizer(embedder)}
            if bundle is CIDER:  # the bundle with a scripted reply
                synthesizers["claude-scripted"] = _claude(
                    scripted_reply(seed_cites, titles), requests
                )
            for kind, synthesizer in synthesizers.items():
                name = f"{bundle.name}/{kind}"
                started = time.perf_counter()
                outcome = run_research(
                    ResearchRequest(org_id=org, client_name=bundle.client_name),
                    registry=registry, store=store, embedder=lambda: embedder,
                    synthesizer=synthesizer, public_context=False,
                )  # fmt: skip
                seconds = time.perf_counter() - started
                drafts = {d.filename: d.content for d in outcome.response.documents}
                if drafts_dir is not None:
                    (drafts_dir / name).mkdir(parents=True, exist_ok=True)
                    for filename, content in drafts.items():
                        (drafts_dir / name / filename).write_text(content)
                coverage = score_drafts(drafts, seed_cites, facts)
                kept = _citations_kept(registry, outcome.doc_ids)
                paths[name] = {
                    **coverage.to_dict(),
                    "citation_kept": sum(
                        f.cited and seed_cites[f.seed] in kept.get(f.draft, ())
                        for f in coverage.facts
                    ),
                    "missing": coverage.missing(),
                    "draft_chars": {k: len(v) for k, v in drafts.items()},
                    "seconds": round(seconds, 2),
                    "synthesizer": outcome.synthesizer,
                }
            if requests:  # the request carried every seed's id for Claude to cite
                user = requests[0]["messages"][0]["content"]
                paths[f"{bundle.name}/claude-scripted"]["request_lists_every_seed"] = all(
                    f"[{cid}]" in user for cid in seed_cites.values()
                )
    return {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "bundles": bundles,
        "summary": {
            name: {k: row[k] for k in ("facts", "found_ratio", "cited_ratio", "citation_kept")}
            for name, row in paths.items()
        },
        "paths": paths,
    }


def _citations_kept(registry: Any, doc_ids: list[str]) -> dict[str, set[str]]:
    """Per persisted draft (by filename), the ids its citations metadata keeps with a URI."""
    kept: dict[str, set[str]] = {}
    for doc in registry.get_documents(doc_ids).values():
        name = doc.uri.rsplit("/", 1)[-1]
        kept[name] = {c.cite_id for c in doc.citations if c.uri}
    return kept


if __name__ == "__main__":
    raise SystemExit(main())

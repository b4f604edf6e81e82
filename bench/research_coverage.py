"""Research fact coverage: how many facts of a seed bundle land in the right draft, cited.

Each bundle of `evals.research_coverage` (``cider``: a cider maker's brand guide, product sheet,
legal notes, contacts CSV and call notes, 39 expected facts; ``physio``: a clinic's HTML price
list, team page and legal bullets, 23 facts; ``fixings``: a fastener distributor's PDF
handbook, XLSX workbook, two text files, a URL and a steering prompt, 37 facts and one the
prompt leaves out) is seeded (files, URLs, prompt) into its own org of a fresh
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
resolved to the seed's URI); precision (the share of the drafts' factual units that cite a
seed or fetched source and quote no prompt sentence), prompt sentences quoted as facts,
duplicated blocks, misfiled facts (in a draft other than their kind's) and left-out facts
found. Prints a Markdown table and saves bench/results/research_coverage.json.

With ``--cli`` the extractive path also runs as an account manager runs it, ``kbflow seed``
then ``kbflow research`` (the Prefect flow) in subprocesses on this checkout (rows
``<bundle>/extractive-cli``; they should equal the in-process rows).

``--provider anthropic|openai`` has the configured model write the drafts instead of the offline
synthesizer (``ANTHROPIC_API_KEY``; ``KBFLOW_LLM_BASE_URL`` and ``KBFLOW_LLM_MODEL``), through
the function the flow's task chooses with (`tasks.research.synthesizers.synthesizer_for`);
rows are named ``<bundle>/<provider>`` and the scripted path is left out.

``--walkthrough`` also researches the walk-through's seeds, taken from the shared real documents
(`evals.research_walkthrough`: three PDFs, a DOCX, a PPTX, an HTML page, a CSV and a prompt),
with the same synthesizer, and counts the page furniture quoted (contents lines, page numbers,
running footers), quotes given twice, and the people and contacts the contacts draft names
with their role or company; skipped without the dataset.

Usage: ``.venv/bin/python bench/research_coverage.py [--home DIR] [--drafts DIR] [--cli]
[--provider none|anthropic|openai] [--walkthrough]`` (a temporary home by default; ``--drafts``
writes each path's four drafts there to read). No network needed; under a minute on two cores,
about two more with ``--cli``, two more with ``--walkthrough``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.stats import save_results  # noqa: E402


def _claude(script: str) -> tuple[Any, Any]:
    """An `AnthropicSynthesizer` whose HTTP is answered by ``script`` (the real SDK on the
    tests' scripted transport, no network), and the recorder that keeps its requests."""
    from tasks.research.claude import AnthropicSynthesizer
    from tests.anthropic_mock import Recorder, anthropic_client, message

    recorder = Recorder(message(script, tokens_in=0, tokens_out=0))
    return AnthropicSynthesizer(
        "unused", client=anthropic_client(recorder), max_retries=0
    ), recorder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--home", type=Path, help="KBFLOW_HOME to use (default: a temp dir)")
    parser.add_argument("--drafts", type=Path, help="also write each path's drafts under DIR")
    parser.add_argument(
        "--cli",
        action="store_true",
        help="also run the extractive path through `kbflow seed` and `kbflow research` "
        "(the Prefect flow, in subprocesses: slower)",
    )
    parser.add_argument(
        "--provider",
        choices=("none", "anthropic", "openai"),
        default="none",
        help="who writes the drafts: none (offline evidence packs, the default), anthropic "
        "(ANTHROPIC_API_KEY) or openai (KBFLOW_LLM_BASE_URL, KBFLOW_LLM_MODEL)",
    )
    parser.add_argument(
        "--walkthrough",
        action="store_true",
        help="also research the walk-through's seeds from the shared real documents "
        "(evals.research_walkthrough: page furniture, repeated quotes, contacts)",
    )
    args = parser.parse_args()
    home = args.home or Path(tempfile.mkdtemp(prefix="kbflow-research-bench-"))
    os.environ["KBFLOW_HOME"] = str(home)
    if args.provider != "anthropic":
        os.environ.pop("ANTHROPIC_API_KEY", None)
    try:
        out = run(home, args.drafts, provider=args.provider, walkthrough=args.walkthrough)
        if args.cli:
            out["paths"].update(run_cli(home / "cli"))
            out["summary"] = _summary(out["paths"])
    finally:
        if args.home is None:
            shutil.rmtree(home, ignore_errors=True)
    walk = out.get("walkthrough")
    if walk:
        print(
            f"walk-through ({walk['synthesizer']}): {walk['lines']} quoted lines, "
            f"{walk['furniture_lines']} page furniture, {walk['duplicate_quote_lines']} "
            f"repeated quotes, {walk['not_in_reference_lines']} not in the reference text; "
            f"people named with their role {sum(walk['people_with_role'].values())}/"
            f"{len(walk['people_with_role'])}, CSV contacts named with company or e-mail "
            f"{walk['csv_contacts_named']}/{walk['csv_contacts']}"
        )
        for kind in ("furniture", "duplicate_quotes", "not_in_reference"):
            for line in walk[kind]:
                print(f"  {kind}: {line[:140]}")
    print(
        "| bundle/path | facts | in the right draft | and cited to their seed | citation kept "
        "| precision | prompt quoted | duplicated blocks | misfiled | left-out found |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, row in out["paths"].items():
        print(
            f"| {name} | {row['facts']} | {row['found']} ({row['found_ratio']:.1%}) "
            f"| {row['cited']} ({row['cited_ratio']:.1%}) | {row['citation_kept']} "
            f"| {row['precision']:.1%} ({row['from_sources']}/{row['factual_units']}) "
            f"| {row['prompt_quoted']} | {row['duplicated_blocks']} | {row['misfiled']} "
            f"| {len(row['left_out_found'])} |"
        )
    for name, row in out["paths"].items():
        if row["missing"]:
            print(f"{name}: not in the right draft or not cited: {', '.join(row['missing'])}")
        if row["misfiled"]:
            print(f"{name}: also in another draft: {', '.join(row['misfiled_ids'])}")
    print("claude-scripted measures kbflow's handling of a scripted reply, not Claude's quality.")
    save_results("research_coverage", out, unprinted="paths")
    return 0


def run(
    home: Path, drafts_dir: Path | None = None, *, provider: str = "none", walkthrough: bool = False
) -> dict[str, Any]:
    from core.models import ResearchRequest
    from core.settings import Settings
    from evals.research_coverage import BUNDLES_ALL, CIDER, score_drafts, scripted_reply
    from sinks.connect import open_registry, open_vector_store
    from tasks.ingest.isolate import isolated_extractor
    from tasks.llm_choice import provider_settings
    from tasks.research.run import run_research
    from tasks.research.seed import SeedBundle, list_seeds, seed_bundle
    from tasks.research.synthesizers import synthesizer_for
    from tasks.text.embed import embedder_for

    settings = provider_settings(Settings(home=home), provider)
    embedder = embedder_for(settings)
    path_name = "extractive" if provider == "none" else provider
    paths: dict[str, Any] = {}
    bundles: dict[str, Any] = {}
    with open_registry(settings) as registry, open_vector_store(settings, share=False) as store:
        for bundle in BUNDLES_ALL:
            org = bundle.name
            registry.people.ensure_org(org, bundle.client_name)
            with isolated_extractor(settings) as extract:
                seeded = seed_bundle(
                    SeedBundle(files=tuple(bundle.seed_files()), urls=bundle.urls(),
                               prompts=bundle.prompts()),
                    org, registry=registry, store=store, embedder=embedder, extract_file=extract,
                )  # fmt: skip
            seeds = list_seeds(registry, org)
            seed_cites = {Path(d.uri).name: f"doc:{d.id}" for d in seeds}
            prompt_cites = {f"doc:{d.id}" for d in seeds if d.source_tag == "am_prompt"}
            titles = {f"doc:{d.id}": d.title for d in seeds}
            facts = bundle.facts()
            bundles[bundle.name] = {
                "client": bundle.client_name,
                "seeds": sorted(seed_cites),
                "stored": seeded.documents,
                "facts": len(facts),
            }
            requests: list[dict[str, Any]] = []
            synthesizers: dict[str, Any] = {path_name: synthesizer_for(settings)}
            if bundle is CIDER and provider == "none":  # the bundle with a scripted reply
                claude, recorder = _claude(scripted_reply(seed_cites, titles))
                synthesizers["claude-scripted"] = claude
                requests = recorder.bodies
            for kind, synthesizer in synthesizers.items():
                name = f"{bundle.name}/{kind}"
                started = time.perf_counter()
                outcome = run_research(
                    ResearchRequest(org_id=org, client_name=bundle.client_name),
                    registry=registry, store=store, embedder=lambda: embedder,
                    synthesizer=synthesizer, public_context=False,
                )  # fmt: skip
                seconds = time.perf_counter() - started
                drafts = {d.filename: d.content for d in outcome.documents}
                if drafts_dir is not None:
                    (drafts_dir / name).mkdir(parents=True, exist_ok=True)
                    for filename, content in drafts.items():
                        (drafts_dir / name / filename).write_text(content)
                coverage = score_drafts(drafts, seed_cites, facts, bundle.prompts(), prompt_cites)
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
        walked = (
            _walkthrough(settings, registry, store, embedder, drafts_dir, path_name)
            if walkthrough
            else None
        )
    return {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "provider": provider,
        "bundles": bundles,
        "summary": _summary(paths),
        "paths": paths,
        **({"walkthrough": walked} if walked else {}),
    }


def _walkthrough(
    settings: Any, registry: Any, store: Any, embedder: Any, drafts_dir: Path | None, name: str
) -> dict[str, Any] | None:
    """Research the walk-through's seeds (`evals.research_walkthrough`) in an org of its own,
    with the bench's synthesizer, and score the drafts."""
    from core.models import ResearchRequest
    from evals import research_walkthrough as walk
    from tasks.ingest.isolate import isolated_extractor
    from tasks.research.run import run_research
    from tasks.research.seed import SeedBundle, list_seeds, seed_bundle
    from tasks.research.synthesize import CONTACTS
    from tasks.research.synthesizers import synthesizer_for
    from tasks.text.chunk import chunks_to_markdown

    reason = walk.available()
    if reason:
        print(f"walk-through skipped: {reason}")
        return None
    org = "walkthrough"
    registry.people.ensure_org(org, walk.CLIENT)
    with isolated_extractor(settings) as extract:
        seed_bundle(
            SeedBundle(files=tuple(walk.seed_files()), urls=(), prompts=(walk.PROMPT,)),
            org, registry=registry, store=store, embedder=embedder, extract_file=extract,
        )  # fmt: skip
    seeds = [d for d in list_seeds(registry, org) if d.source_tag != "am_prompt"]
    cites = {f"doc:{d.id}": Path(d.uri).name for d in seeds}
    extracted = {
        Path(d.uri).name: chunks_to_markdown(
            [(tuple(c.payload.get("heading_path") or ()), str(c.payload.get("text", "")))
             for c in store.inspect_document_chunks(d.id)]
        )
        for d in seeds
    }  # fmt: skip
    started = time.perf_counter()
    outcome = run_research(
        ResearchRequest(org_id=org, client_name=walk.CLIENT),
        registry=registry, store=store, embedder=lambda: embedder,
        synthesizer=synthesizer_for(settings), public_context=False,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    drafts = {d.filename: d.content for d in outcome.documents}
    if drafts_dir is not None:
        (drafts_dir / "walkthrough" / name).mkdir(parents=True, exist_ok=True)
        for filename, content in drafts.items():
            (drafts_dir / "walkthrough" / name / filename).write_text(content)
    scored = walk.score(drafts, cites, extracted, CONTACTS)
    return {
        **scored.to_dict(),
        "seeds": sorted(cites.values()),
        "synthesizer": outcome.synthesizer,
        "seconds": round(seconds, 2),
    }


def _summary(paths: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "facts",
        "found_ratio",
        "cited_ratio",
        "citation_kept",
        "precision",
        "prompt_quoted",
        "duplicated_blocks",
        "misfiled",
    )
    return {name: {k: row[k] for k in keys} for name, row in paths.items()}


def run_cli(home: Path) -> dict[str, Any]:
    """The extractive path as an account manager runs it: ``kbflow seed`` (files extracted in
    the isolated worker) and ``kbflow research`` (the Prefect flow, public context off), each a
    subprocess on this checkout, in a home of its own."""
    from core.settings import Settings
    from evals.research_coverage import BUNDLES_ALL, score_drafts
    from sinks.connect import open_registry

    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),  # this checkout, whatever the venv's install points at
        "KBFLOW_HOME": str(home),
        "KBFLOW_RESEARCH_OFFLINE": "true",
        "PREFECT_HOME": str(home / "prefect"),
        "DO_NOT_TRACK": "1",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
    }

    def kbflow(*args: str) -> Any:
        done = subprocess.run(
            [sys.executable, "-m", "kbflow.cli", *args], env=env, capture_output=True,
            text=True, cwd=REPO, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"kbflow {args[0]} failed ({done.returncode}): {done.stderr[-2000:]}")
        return json.loads(done.stdout) if "--json" in args else None

    paths: dict[str, Any] = {}
    kbflow("users", "add", "bench", "--role", "superadmin")
    for bundle in BUNDLES_ALL:
        org = bundle.name
        kbflow("orgs", "create", org, "--name", bundle.client_name, "--as", "bench")
        files = [arg for path in bundle.seed_files() for arg in ("--file", str(path))]
        files += [arg for url in bundle.urls() for arg in ("--url", url)]
        files += [arg for prompt in bundle.prompts() for arg in ("--prompt", prompt)]
        kbflow("seed", "--org", org, "--as", "bench", *files)
        started = time.perf_counter()
        report = kbflow("research", "--org", org, "--client-name", bundle.client_name,
                        "--as", "bench", "--review-timeout", "0", "--json")  # fmt: skip
        seconds = time.perf_counter() - started
        seeds = kbflow("seed", "list", "--org", org, "--as", "bench", "--json")
        seed_cites = {Path(d["uri"]).name: f"doc:{d['id']}" for d in seeds}
        prompt_cites = {f"doc:{d['id']}" for d in seeds if d["source_tag"] == "am_prompt"}
        drafts = {d["filename"]: d["content"] for d in report["documents"]}
        coverage = score_drafts(drafts, seed_cites, bundle.facts(), bundle.prompts(), prompt_cites)
        with open_registry(Settings(home=home)) as registry:
            kept = _citations_kept(registry, report["doc_ids"])
        paths[f"{org}/extractive-cli"] = {
            **coverage.to_dict(),
            "citation_kept": sum(
                f.cited and seed_cites[f.seed] in kept.get(f.draft, ()) for f in coverage.facts
            ),
            "missing": coverage.missing(),
            "draft_chars": {k: len(v) for k, v in drafts.items()},
            "seconds": round(seconds, 2),
            "synthesizer": report["synthesizer"],
        }
    return paths


def _citations_kept(registry: Any, doc_ids: list[str]) -> dict[str, set[str]]:
    """Per persisted draft (by filename), the ids its citations metadata keeps with a URI."""
    kept: dict[str, set[str]] = {}
    for doc in registry.documents.get_documents(doc_ids).values():
        name = doc.uri.rsplit("/", 1)[-1]
        kept[name] = {c.cite_id for c in doc.citations if c.uri}
    return kept


if __name__ == "__main__":
    raise SystemExit(main())

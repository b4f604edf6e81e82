"""Benchmark: warm search through ``kbflow serve`` over HTTP, beside in-process search.

On SciFact as ingested (5,183 abstracts; ingested into ``--home`` first when it has none), with
SciFact dev queries, in one run:

1. in process, with the store owned by this process: ``search()`` (embedding, gated hybrid
   query, registry re-check) and the ``search_knowledge_base`` tool that the HTTP route calls;
2. ``kbflow serve`` started on the same home, once per ``--workers`` setting (default: 1, the
   single process, and 2, two worker processes beside the store's owner):
   ``POST /v1/agent/search`` with an agent token, 1 client in sequence, then 8 concurrent
   clients (threads), each keeping one connection alive as an agent's client does, then the
   same with a fresh connection per request (kept-alive over fresh: issue 45's stall showed
   as ~40 ms added to every kept-alive request);
3. the same two HTTP runs while ``kbflow ingest`` writes a corpus new to this run (its Prefect
   flow reaching the store through the service), measured from its first committed batch.

Before them, one query at a time through each embedding backend (torch, onnx) in this process.
The service embeds with KBFLOW_EMBEDDING_BACKEND (default onnx).

For each: requests, median and p95 latency, throughput (requests/s of wall time), errors and
degraded responses. Ratios within the run: HTTP p95 over in-process p95, and throughput at 8
clients over 1 client (the targets: HTTP p95 <= 30 ms at 1 client; 8 clients >= 1.6x 1 client).

4. the noisy neighbour: one agent's client asks ordinary questions (``POST /v1/agent/answer``,
   SciFact dev claims) alone, then while another agent's client sends, back to back, the largest
   questions the bounds allow to /answer and /ask (five of them) and a 2,000-character question
   of real sentences (over the content-word bound: refused at once); the normal client's p95
   beside its p95 alone. Run it from an older checkout to see what the bounds changed.

Run: ``.venv/bin/python bench/serve.py [--home DIR] [--requests N] [--cases idle,ingest,noisy]``;
saves
bench/results/serve.json. Needs ../shared/datasets/scifact (or KBFLOW_DATASETS).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.stats import latency  # noqa: E402  (after the path is set)
from kbflow.api.launch import launched  # noqa: E402

DATASETS = Path(os.environ.get("KBFLOW_DATASETS", REPO.parent / "shared" / "datasets"))
ORG = "sci"
AGENT = "bench-bot"
ABUSER = "bench-abuser"
CLIENTS = 8


def _figures(samples: list[float], wall_s: float, errors: int = 0, degraded: int = 0) -> dict:
    figures: dict[str, Any] = latency(samples, digits=2)
    return {
        "requests": figures.pop("n"),
        **figures,
        "throughput_rps": round(len(samples) / wall_s, 1),
        "errors": errors,
        "degraded": degraded,
    }


def _kbflow(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KBFLOW_HOME": str(home), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "kbflow.cli", *args], env=env, capture_output=True, text=True
    )


def _ensure_scifact(home: Path, corpus: Path) -> int:
    """SciFact in ``home`` (ingested now if absent); returns its document count."""
    from core.settings import Settings
    from sinks.connect import open_registry

    with open_registry(Settings(home=home)) as registry:
        registry.people.ensure_org(ORG)
        have = len(registry.documents.current_documents(ORG))
    if have < 5000:
        print(f"ingesting SciFact into {home} (once; ~7 minutes on 2 cores) ...", flush=True)
        done = _kbflow(home, "ingest", str(corpus), "--org", ORG, "--json")
        if done.returncode != 0:
            raise SystemExit(f"the SciFact ingest failed:\n{done.stderr[-3000:]}")
        with open_registry(Settings(home=home)) as registry:
            have = len(registry.documents.current_documents(ORG))
    return have


def _agent_token(home: Path, agent: str = AGENT) -> str:
    from core.errors import NotFound
    from core.settings import Settings
    from sinks.connect import open_registry

    with open_registry(Settings(home=home)) as registry:
        try:
            registry.catalog.get_agent(agent)
        except NotFound:
            registry.catalog.create_agent(ORG, agent, "benchmark agent")
            registry.catalog.set_allowed(agent, ["default"], allow=True)
        _, secret = registry.tokens.create_token(
            agent_id=agent, expires_at=None, created_by="bench"
        )
    return secret


def _in_process(home: Path, texts: list[str]) -> dict[str, Any]:
    from core.models import Scope, SearchMode
    from core.settings import Settings
    from kbflow.services.query import tools
    from kbflow.services.query.context import open_home

    scope = Scope(org_id=ORG)
    with open_home(Settings(home=home)) as ctx:
        for t in texts[:10]:
            ctx.search(t, scope, mode=SearchMode.HYBRID, top_k=10)  # warm

        def timed(call: Callable[[str], Any]) -> dict[str, Any]:
            samples = []
            started = time.perf_counter()
            for text in texts:
                t = time.perf_counter()
                call(text)
                samples.append(time.perf_counter() - t)
            return _figures(samples, time.perf_counter() - started)

        search = timed(lambda q: ctx.search(q, scope, mode=SearchMode.HYBRID, top_k=10))
        tool = timed(lambda q: tools.call_tool(ctx, "search_knowledge_base", AGENT, {"query": q}))
    return {"search": search, "search_knowledge_base": tool}


def _query_embedding(texts: list[str]) -> dict[str, Any]:
    """One query at a time through each embedding backend, alternating, in this process."""
    from tasks.text.embed import MiniLMEmbedder

    backends = {name: MiniLMEmbedder(backend=name) for name in ("torch", "onnx")}
    samples: dict[str, list[float]] = {name: [] for name in backends}
    for embedder in backends.values():
        embedder.embed_documents(texts[:5])  # load and warm
    for text in texts:
        for name, embedder in backends.items():
            t = time.perf_counter()
            embedder.embed_documents([text])  # not embed_query: it remembers recent queries
            samples[name].append(time.perf_counter() - t)
    out: dict[str, Any] = {
        name: {"backend_used": backends[name].backend_used, **latency(s, digits=2)}
        for name, s in samples.items()
    }
    out["torch_p95_over_onnx_p95"] = round(out["torch"]["p95_ms"] / out["onnx"]["p95_ms"], 2)
    return out


def _http(
    base: str, token: str, texts: list[str], clients: int, total: int, *, fresh: bool = False
) -> dict[str, Any]:
    """``total`` searches from ``clients`` concurrent clients: each client keeps one connection
    alive for all its requests (as an agent's HTTP client or MCP session does), or, with
    ``fresh``, opens a new connection for every request."""
    import httpx

    samples: list[float] = []
    counts = {"errors": 0, "degraded": 0}
    lock = threading.Lock()
    headers = {"Authorization": f"Bearer {token}"}

    def one(client: httpx.Client, q: str) -> None:
        t = time.perf_counter()
        try:
            r = client.post(f"{base}/v1/agent/search", json={"query": q})
            ok, degraded = r.status_code == 200, r.status_code == 200 and r.json()["degraded"]
        except httpx.HTTPError:
            ok, degraded = False, False
        took = time.perf_counter() - t
        with lock:
            samples.append(took)
            counts["errors"] += not ok
            counts["degraded"] += bool(degraded)

    def run(k: int) -> None:
        mine = [texts[(k + i * clients) % len(texts)] for i in range(total // clients)]
        if fresh:
            for q in mine:
                with httpx.Client(headers=headers, timeout=60) as client:
                    one(client, q)
            return
        with httpx.Client(headers=headers, timeout=60) as client:
            for q in mine:
                one(client, q)

    for q in texts[:5]:  # warm this route and connection path
        httpx.post(f"{base}/v1/agent/search", json={"query": q}, headers=headers, timeout=60)
    threads = [threading.Thread(target=run, args=(k,)) for k in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out = _figures(samples, time.perf_counter() - started, **counts)
    out["connections"] = "fresh" if fresh else "kept-alive"
    return out


def _largest_allowed_question() -> str:
    """As many content words as a question may hold, padded with stop words to the character
    limit: the most work one allowed request can ask of the service (`tasks.query.bounds`)."""
    from tasks.query.bounds import MAX_QUERY_CHARS, MAX_QUERY_TERMS
    from tasks.text.sparse import analyze

    words = [
        "abstract",
        "cohort",
        "trial",
        "patients",
        "protein",
        "expression",
        "tumour",
        "dose",
        "mice",
        "receptor",
        "gene",
        "therapy",
        "outcome",
        "mortality",
        "infection",
        "vaccine",
        "kinase",
        "cells",
        "signalling",
        "pathway",
    ]
    said = [f"{words[i % len(words)]}{i // len(words) or ''}" for i in range(MAX_QUERY_TERMS)]
    text = " ".join(said)
    text += " the" * ((MAX_QUERY_CHARS - len(text)) // 4)  # whole stop words up to the limit
    assert len(analyze(text)) == MAX_QUERY_TERMS
    return text


def _answers(base: str, token: str, texts: list[str]) -> dict[str, Any]:
    """One client asking ``texts`` in sequence (``POST /v1/agent/answer``)."""
    import httpx

    samples: list[float] = []
    errors = 0
    started = time.perf_counter()
    with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=300) as client:
        for q in texts:
            t = time.perf_counter()
            try:
                errors += client.post(f"{base}/v1/agent/answer", json={"question": q}).is_error
            except httpx.HTTPError:
                errors += 1
            samples.append(time.perf_counter() - t)
    return _figures(samples, time.perf_counter() - started, errors=errors)


def _noisy_neighbour(
    base: str, token: str, abuser_token: str, texts: list[str], count: int
) -> dict[str, Any]:
    """A normal client's answers alone, then the same questions while another agent's client
    sends the largest questions allowed to /answer and /ask back to back."""
    import httpx

    # Two disjoint sets of claims, interleaved (even / odd): each is asked once, from cold (a
    # question asked again reuses its cached vectors and would look faster beside the abuser).
    first, second = texts[: 2 * count : 2], texts[1 : 2 * count : 2]
    for q in texts[2 * count : 2 * count + 3]:  # warm the answer path
        httpx.post(f"{base}/v1/agent/answer", json={"question": q},
                   headers={"Authorization": f"Bearer {token}"}, timeout=300)  # fmt: skip
    alone = _answers(base, token, first)
    longest = _largest_allowed_question()
    # 2,000 characters of real sentences (~300 content words): what the answer route took
    # before queries were bounded by content words too (refused at once now).
    prose = " ".join(texts[-40:])[:2000]
    stop = threading.Event()
    abusive: list[float] = []
    statuses: dict[str, int] = {}

    def abuse() -> None:
        bodies = (("/v1/agent/answer", {"question": longest}),
                  ("/v1/agent/ask", {"queries": [longest] * 5}),
                  ("/v1/agent/answer", {"question": prose}))  # fmt: skip
        with httpx.Client(headers={"Authorization": f"Bearer {abuser_token}"}, timeout=600) as c:
            while not stop.is_set():
                for path, body in bodies:
                    t = time.perf_counter()
                    status = str(c.post(base + path, json=body).status_code)
                    abusive.append(time.perf_counter() - t)
                    statuses[status] = statuses.get(status, 0) + 1

    thread = threading.Thread(target=abuse, daemon=True)
    thread.start()
    time.sleep(1.0)
    try:
        beside = _answers(base, token, second)
    finally:
        stop.set()
        thread.join(timeout=600)
    return {
        "normal_alone": alone,
        "normal_beside_abuser": beside,
        "abuser": _figures(abusive, sum(abusive) or 1.0),
        "abuser_statuses": statuses,
        "p95_beside_over_alone": round(beside["p95_ms"] / alone["p95_ms"], 2),
    }


def _second_corpus(path: Path, count: int, nonce: str) -> Path:
    """``count`` new documents (``nonce`` makes them new in every run, so the ingest really
    embeds and writes them rather than skipping them as unchanged)."""
    rng = random.Random(nonce)
    words = ["assay", "cohort", "lesion", "protein", "enzyme"]
    words += ["dosage", "trial", "marker", "tissue", "signal"]
    with path.open("w") as out:
        for i in range(count):
            text = " ".join(rng.choice(words) for _ in range(60))
            row = {"_id": f"extra-{nonce}-{i}", "title": f"Extra {nonce} {i}", "text": text}
            out.write(json.dumps(row) + "\n")
    return path


def _ingested(home: Path, prefix: str) -> int:
    """Documents whose title starts with ``prefix`` that the ingest has committed."""
    import sqlite3

    with sqlite3.connect(home / "registry.db", timeout=30) as db:
        (n,) = db.execute(
            "SELECT count(*) FROM documents WHERE title LIKE ? AND parse_status = 'ingested'",
            (prefix + "%",),
        ).fetchone()
    return int(n)


def _configuration(
    home: Path, token: str, texts: list[str], args: argparse.Namespace, workers: int
) -> dict[str, Any]:
    """One service configuration: idle at 1 and 8 clients, then the same during an ingest."""
    threads = args.torch_threads
    env = {"KBFLOW_API_RATE_PER_MINUTE": "1000000", "KBFLOW_API_RATE_BURST": "100000"}
    if threads is not None:
        env["KBFLOW_API_TORCH_THREADS"] = str(threads)
    out: dict[str, Any] = {"workers": workers, "torch_threads": threads}
    log = home / f"bench-serve-{workers}.log"
    with launched(home, log, env=env, args=("--workers", str(workers))) as service:
        base = service.base
        if "noisy" in args.cases:
            print(f"[workers={workers}] noisy neighbour: answers alone, then beside ...",
                  flush=True)  # fmt: skip
            out["noisy_neighbour"] = _noisy_neighbour(
                base, token, _agent_token(home, ABUSER), texts, args.answers
            )
        if "idle" not in args.cases:
            return out
        print(f"[workers={workers}] HTTP, 1 client ...", flush=True)
        one = _http(base, token, texts, 1, args.requests)
        print(f"[workers={workers}] HTTP, 8 clients ...", flush=True)
        eight = _http(base, token, texts, CLIENTS, args.requests)
        print(f"[workers={workers}] HTTP, fresh connections, 1 and 8 clients ...", flush=True)
        one_f = _http(base, token, texts, 1, args.requests, fresh=True)
        eight_f = _http(base, token, texts, CLIENTS, args.requests, fresh=True)
        out["idle"] = {
            "clients_1": one,
            "clients_8": eight,
            "clients_1_fresh": one_f,
            "clients_8_fresh": eight_f,
        }
        out["ratios"] = {
            "kept_alive_p50_over_fresh_p50_1_client": round(
                one["median_ms"] / one_f["median_ms"], 2
            ),
            "kept_alive_p50_over_fresh_p50_8_clients": round(
                eight["median_ms"] / eight_f["median_ms"], 2
            ),
            "throughput_8_over_1": round(eight["throughput_rps"] / one["throughput_rps"], 2),
        }
        if "ingest" not in args.cases:
            return out

        nonce = f"{int(time.time())}w{workers}"
        extra = _second_corpus(home / f"bench-extra-{nonce}.jsonl", args.ingest_docs, nonce)
        ingest_env = {**os.environ, "KBFLOW_HOME": str(home), "PYTHONPATH": str(REPO)}
        with (home / "bench-ingest.log").open("w") as ingest_log:
            ingest = subprocess.Popen(
                [sys.executable, "-m", "kbflow.cli", "ingest", str(extra), "--org", ORG,
                 "--collection", "extra", "--json"],
                env=ingest_env, stdout=ingest_log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + 300
        while _ingested(home, f"Extra {nonce} ") == 0:  # measure once it is writing
            if ingest.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the ingest ended or stalled before writing anything")
            time.sleep(0.5)
        print(f"[workers={workers}] HTTP during an ingest, 1 client ...", flush=True)
        one_i = _http(base, token, texts, 1, args.requests // 2)
        print(f"[workers={workers}] HTTP during an ingest, 8 clients ...", flush=True)
        eight_i = _http(base, token, texts, CLIENTS, args.requests // 2)
        running = ingest.poll() is None
        written = _ingested(home, f"Extra {nonce} ")
        out["during_ingest"] = {
            "clients_1": one_i,
            "clients_8": eight_i,
            "ingest_running_throughout": running,
            "documents_written_by_then": written,
            "ingest_exit_code": ingest.wait(),
        }
    out["ratios"] |= {
        "during_ingest_throughput_8_over_1": round(
            eight_i["throughput_rps"] / one_i["throughput_rps"], 2
        ),
        "during_ingest_p95_over_idle_p95": round(one_i["p95_ms"] / one["p95_ms"], 2),
    }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--home", type=Path, default=None, help="data dir (default: a temp dir)")
    parser.add_argument("--requests", type=int, default=400, help="HTTP searches per run")
    parser.add_argument("--ingest-docs", type=int, default=3000, help="documents of the ingest")
    parser.add_argument(
        "--torch-threads", type=int, default=None,
        help="KBFLOW_API_TORCH_THREADS for the service (default: the setting's default)",
    )  # fmt: skip
    parser.add_argument(
        "--workers", type=lambda v: [int(x) for x in v.split(",")], default=[1, 2],
        help="the kbflow serve --workers settings to measure, comma-separated (default 1,2)",
    )  # fmt: skip
    parser.add_argument(
        "--cases", type=lambda v: set(v.split(",")),
        default={"idle", "ingest", "noisy"},
        help="what to measure, comma-separated: idle (searches at 1 and 8 clients, on kept-alive "
        "and on fresh connections), ingest (the same during an ingest; needs idle), noisy (a "
        "normal client's answers alone and beside one sending the largest questions allowed); "
        "default all three",
    )  # fmt: skip
    parser.add_argument("--answers", type=int, default=40, help="normal answers per noisy run")
    parser.add_argument("--skip-in-process", action="store_true",
                        help="skip the in-process and query-embedding measurements")  # fmt: skip
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "serve.json")
    args = parser.parse_args()

    corpus = DATASETS / "scifact" / "corpus.jsonl.gz"
    queries_path = DATASETS / "scifact" / "dev" / "queries.jsonl"
    if not corpus.exists():
        print(f"SciFact not found at {corpus}; set KBFLOW_DATASETS", file=sys.stderr)
        return 2
    home = (args.home or Path(tempfile.mkdtemp(prefix="kbflow-bench-serve-"))).resolve()
    os.environ["KBFLOW_HOME"] = str(home)
    rows = [json.loads(line) for line in queries_path.open(encoding="utf-8")]
    random.Random(7).shuffle(rows)
    texts = [r["text"] for r in rows]

    result: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
        ).stdout.strip(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "documents": _ensure_scifact(home, corpus),
        "queries": len(texts),
        "embedding_backend": os.environ.get("KBFLOW_EMBEDDING_BACKEND", "onnx"),
    }
    token = _agent_token(home)
    if not args.skip_in_process:
        print("query embedding, torch and onnx ...", flush=True)
        result["query_embedding"] = _query_embedding(texts[:200])
        print("in process ...", flush=True)
        result["in_process"] = _in_process(home, texts[:200])

    result["configurations"] = []
    for workers in args.workers:
        config = _configuration(home, token, texts, args, workers)
        if "idle" in args.cases and "in_process" in result:
            in_p95 = result["in_process"]["search_knowledge_base"]["p95_ms"]
            one = config["idle"]["clients_1"]
            config["ratios"]["http_p95_over_in_process_p95"] = round(one["p95_ms"] / in_p95, 2)
        result["configurations"].append(config)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")

    def row(name: str, f: dict[str, Any]) -> str:
        return (
            f"{name:<42} {f['requests']:>5} {f['median_ms']:>8.1f} {f['p95_ms']:>8.1f} "
            f"{f['throughput_rps']:>8.1f} {f['errors']:>4} {f['degraded']:>4}"
        )

    if "query_embedding" in result:
        q = result["query_embedding"]
        print(
            f"query embedding, one at a time: torch median {q['torch']['median_ms']} / p95 "
            f"{q['torch']['p95_ms']} ms; onnx {q['onnx']['median_ms']} / {q['onnx']['p95_ms']} "
            f"ms (torch p95 / onnx p95 = {q['torch_p95_over_onnx_p95']}x); the service embeds "
            f"with {result['embedding_backend']}"
        )
    print(f"{'':<42} {'n':>5} {'med ms':>8} {'p95 ms':>8} {'req/s':>8} {'err':>4} {'degr':>4}")
    if "in_process" in result:
        print(row("in process: search()", result["in_process"]["search"]))
        print(row("in process: search_knowledge_base",
                  result["in_process"]["search_knowledge_base"]))  # fmt: skip
    for config in result["configurations"]:
        w = config["workers"]
        if "idle" in config:
            print(row(f"HTTP, 1 client, kept alive (workers={w})", config["idle"]["clients_1"]))
            print(row(f"HTTP, 8 clients, kept alive (workers={w})", config["idle"]["clients_8"]))
            print(row(f"HTTP, 1 client, fresh (workers={w})",
                      config["idle"]["clients_1_fresh"]))  # fmt: skip
            print(row(f"HTTP, 8 clients, fresh (workers={w})",
                      config["idle"]["clients_8_fresh"]))  # fmt: skip
        if "during_ingest" in config:
            print(row(f"HTTP, 1 client, ingest running (w={w})",
                      config["during_ingest"]["clients_1"]))  # fmt: skip
            print(row(f"HTTP, 8 clients, ingest running (w={w})",
                      config["during_ingest"]["clients_8"]))  # fmt: skip
        if "ratios" in config:
            print(f"  workers={w}: {json.dumps(config['ratios'])}")
        noisy = config.get("noisy_neighbour")
        if noisy:
            print(row(f"answer alone (workers={w})", noisy["normal_alone"]))
            print(row(f"answer beside an abuser (workers={w})", noisy["normal_beside_abuser"]))
            print(row(f"abuser's largest questions (workers={w})", noisy["abuser"]))
            print(f"  workers={w}: normal p95 beside / alone = {noisy['p95_beside_over_alone']}")
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

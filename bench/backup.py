"""Benchmark: back up a SciFact home, back it up again unchanged, verify, and restore it.

Builds a home from the first ``--docs`` SciFact documents (indexed in-process, as an ingest's
batches are, without a Prefect run) plus a few ledger turns, then times:

- the first backup: wall time, bytes (apparent) and bytes on disk;
- a second backup of the unchanged home: wall time and the bytes it really wrote (files not
  hard-linked from the first);
- ``verify`` of the second;
- a restore into a fresh home.

Prints a table and saves JSON (bench/results/backup.json).

Run: ``.venv/bin/python bench/backup.py [--docs 500] [--home DIR]``.
Needs ../shared/datasets/scifact (or KBFLOW_DATASETS).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DATASETS = Path(os.environ.get("KBFLOW_DATASETS", REPO.parent / "shared" / "datasets"))
ORG = "sci"
AGENT = "sci-bot"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--docs", type=int, default=500, help="SciFact documents in the home")
    parser.add_argument("--turns", type=int, default=5, help="answers recorded in the ledger")
    parser.add_argument("--home", type=Path, default=None, help="data dir (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "backup.json")
    args = parser.parse_args()
    corpus = DATASETS / "scifact" / "corpus.jsonl.gz"
    if not corpus.exists():
        print(f"SciFact not found at {corpus}; set KBFLOW_DATASETS", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="kbflow-bench-backup-"))
    home = args.home or work / "home"
    os.environ["KBFLOW_HOME"] = str(home)

    from core.settings import Settings, configure_environment

    settings = Settings()
    configure_environment(settings)
    started = time.perf_counter()
    build_home(settings, corpus, args.docs, args.turns)
    built_s = time.perf_counter() - started

    from kbflow.services.backup.backups import KEY_FILE, backup, backup_key
    from kbflow.services.backup.restore import restore, verify_backup

    first_at = time.perf_counter()
    first = backup(settings, work / "backups" / "first")
    first_s = time.perf_counter() - first_at
    second_at = time.perf_counter()
    second = backup(settings, work / "backups" / "second")
    second_s = time.perf_counter() - second_at
    verify_at = time.perf_counter()
    verify_backup(Path(second.path), backup_key(settings))
    verify_s = time.perf_counter() - verify_at
    fresh = Settings(home=work / "restored")
    restore_at = time.perf_counter()
    restored = restore(fresh, Path(second.path), key_file=settings.home / KEY_FILE)
    restore_s = time.perf_counter() - restore_at

    result: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
        ).stdout.strip(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "docs": args.docs,
        "counts": restored.counts,
        "build_home_s": round(built_s, 2),
        "home_bytes_on_disk": on_disk(home),
        "first_backup": {
            "seconds": round(first_s, 3),
            "bytes": first.bytes,
            "bytes_on_disk": on_disk(Path(first.path)),
            "parts": {k: v.bytes for k, v in first.parts.items()},
        },
        "unchanged_second_backup": {
            "seconds": round(second_s, 3),
            "bytes": second.bytes,
            "linked_bytes": second.linked_bytes,
            "bytes_written": second.bytes - second.linked_bytes,
            "bytes_on_disk_not_linked": new_on_disk(Path(second.path)),
        },
        "verify_s": round(verify_s, 3),
        "restore_s": round(restore_s, 3),
    }
    print(json.dumps(result, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"saved {args.out}")
    return 0


def build_home(settings: Any, corpus: Path, docs: int, turns: int) -> None:
    """The first ``docs`` SciFact documents as approved documents of one org, an agent that
    reads them, and ``turns`` answers to dev questions recorded in the ledger."""
    from core.models import DocStatus
    from kbflow.services.query import answers
    from kbflow.services.query.context import open_home
    from sinks.connect import open_registry, open_vector_store
    from tasks.ingest.discover import Source
    from tasks.ingest.index import IngestTarget, WorkItem, index_batch
    from tasks.text.embed import embedder_for

    records = []
    with gzip.open(corpus, "rt", encoding="utf-8") as lines:
        for line in lines:
            row = json.loads(line)
            records.append((str(row["_id"]), row.get("title") or "", row.get("text") or ""))
            if len(records) >= docs:
                break
    embedder = embedder_for(settings)
    with open_registry(settings) as registry, open_vector_store(settings) as store:
        registry.people.ensure_org(ORG)
        coll = registry.catalog.ensure_collection(ORG, "scifact")
        target = IngestTarget(
            org_id=ORG, collection_id=coll.id, collection_path=coll.path,
            status=DocStatus.APPROVED, audience=None, effective_date=None, source_tag=None,
        )  # fmt: skip
        for start in range(0, len(records), 64):
            items = [
                WorkItem(
                    Source(
                        source_key=f"scifact://{doc_id}",
                        uri=f"scifact://{doc_id}",
                        content_hash=str(hash((title, text))),
                        path=Path(doc_id),
                        record=(title, text),
                        markdown=False,
                    ),
                    previous=None,
                )
                for doc_id, title, text in records[start : start + 64]
            ]
            index_batch(
                items, target, store=store, registry=registry, embedder=embedder,
                extract_file=_no_files,
            )  # fmt: skip
        registry.catalog.create_agent(ORG, AGENT, "SciFact questions")
    dev = DATASETS / "scifact" / "dev" / "queries.jsonl"
    questions = [json.loads(line)["text"] for line in dev.read_text().splitlines()[:turns]]
    with open_home(settings) as ctx:
        for question in questions:
            answers.answer(ctx, AGENT, question)


def _no_files(source: Any) -> Any:
    raise AssertionError(f"unexpected file source {source}")


def on_disk(root: Path) -> int:
    """Bytes ``root``'s files take on disk (holes excluded; a hard-linked file counted once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for path in root.rglob("*"):
        st = path.lstat()
        if path.is_file() and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


def new_on_disk(root: Path) -> int:
    """Bytes on disk of ``root``'s files that no other backup shares (link count 1)."""
    return sum(
        p.lstat().st_blocks * 512
        for p in root.rglob("*")
        if p.is_file() and p.lstat().st_nlink == 1
    )


if __name__ == "__main__":
    raise SystemExit(main())

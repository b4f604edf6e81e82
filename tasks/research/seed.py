"""The account manager's seed bundle: files, URLs and free-text prompts for research.

Each input becomes a registry document tagged ``am_file``, ``am_url`` or ``am_prompt`` in the
org's ``am-inputs`` collection, for the ``account_manager`` audience: reviewers can read them,
agents (whose scope does not include that audience) never retrieve them. Files are extracted like
any ingest; a URL is stored as given and fetched (SSRF-guarded) when research runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

from core.errors import ConfigError, UnsafeUrl
from core.models import DocStatus, ExtractedDocument, SourceTag
from sinks.registry import DocRecord, SqlRegistry
from sinks.vectors import VectorStore
from tasks.ingest.discover import Source, file_sha256
from tasks.ingest.index import BatchReport, IngestTarget, index_batch, plan_ingest
from tasks.research.fetch import check_url_shape
from tasks.text.embed import Embedder

SEED_COLLECTION = "am-inputs"
SEED_AUDIENCE = "account_manager"
MAX_SEED_FILES = 20
MAX_SEED_FILE_BYTES = 25 * 1024 * 1024
MAX_SEED_URLS = 20
SEED_TAGS = (SourceTag.AM_FILE, SourceTag.AM_URL, SourceTag.AM_PROMPT)


@dataclass(frozen=True)
class SeedBundle:
    """Files, URLs and prompts to seed. ``file_uris``, when given, names where each file came
    from (an upload: ``upload:<org>/<name>``), one per file: the file is keyed and shown by it
    instead of by the path it was stored at for the while it is read."""

    files: tuple[Path, ...] = ()
    urls: tuple[str, ...] = ()
    prompts: tuple[str, ...] = ()
    file_uris: tuple[str, ...] = ()
    allow_loopback: bool = False  # the SSRF guard's test-only switch (`check_url_shape`)

    def check(self) -> None:
        """Refuse a bundle that breaks a limit, before anything is stored."""
        if not (self.files or self.urls or self.prompts):
            raise ConfigError(
                "the seed bundle is empty: give at least one --file, --url or --prompt."
            )
        if self.file_uris and len(self.file_uris) != len(self.files):
            raise ConfigError(
                f"file_uris names {len(self.file_uris)} file(s) for {len(self.files)} files: "
                "give one URI per file, or none."
            )
        if len(self.files) > MAX_SEED_FILES:
            raise ConfigError(
                f"a seed bundle takes at most {MAX_SEED_FILES} files; got {len(self.files)}. "
                "Seed the most useful ones, or ingest the rest with `kbflow ingest`."
            )
        for path in self.files:
            if path.is_symlink():
                raise ConfigError(
                    f"seed file {path} is a symbolic link: kbflow never follows links. Seed the "
                    "file it points to. Nothing was stored."
                )
            if not path.is_file():
                raise ConfigError(f"seed file {path} does not exist or is not a file.")
            size = path.stat().st_size
            if size > MAX_SEED_FILE_BYTES:
                raise ConfigError(
                    f"seed file {path.name} is {size / 2**20:.1f} MiB; the limit is "
                    f"{MAX_SEED_FILE_BYTES // 2**20} MiB per file. Split or trim it. "
                    "Nothing was stored."
                )
        if len(self.urls) > MAX_SEED_URLS:
            raise ConfigError(
                f"a seed bundle takes at most {MAX_SEED_URLS} URLs; got {len(self.urls)}. "
                "Seed the most useful pages; research fetches more under its budget. Nothing "
                "was stored."
            )
        for url in self.urls:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConfigError(
                    f"seed URL {url!r} is not an http(s) URL with a host. Nothing was stored."
                )
            try:
                check_url_shape(url, allow_loopback=self.allow_loopback)  # the fetch's rules
            except UnsafeUrl as exc:
                raise UnsafeUrl(f"{exc} Nothing was stored.") from exc
        for prompt in self.prompts:
            if not prompt.strip():
                raise ConfigError("a seed prompt is empty. Nothing was stored.")


def _file_key(uri: str) -> str:
    return f"am_file:{uri}"


def _file_uris(bundle: SeedBundle) -> list[str]:
    """Each file's URI: the one it came with, else its path's."""
    return list(bundle.file_uris) or [p.resolve().as_uri() for p in bundle.files]


def check_room(bundle: SeedBundle, registry: SqlRegistry, org_id: str) -> None:
    """Refuse a bundle that would take the org's seed bundle past its file cap: the cap holds
    for the bundle as a whole (what earlier `seed` commands stored counts), not per command.
    Re-seeding a file already in the bundle takes no new room."""
    seeded = {d.source_key for d in list_seeds(registry, org_id) if d.source_tag == "am_file"}
    adding = {_file_key(uri) for uri in _file_uris(bundle)} - seeded
    if len(seeded) + len(adding) > MAX_SEED_FILES:
        raise ConfigError(
            f"org {org_id!r}'s seed bundle holds {len(seeded)} file(s); {len(adding)} more "
            f"would pass its cap of {MAX_SEED_FILES} files per org. Seed at most "
            f"{max(MAX_SEED_FILES - len(seeded), 0)} more, or ingest the rest with `kbflow "
            "ingest`. Nothing was stored."
        )


def bundle_sources(bundle: SeedBundle, org_id: str) -> dict[SourceTag, list[Source]]:
    """The bundle's inputs as sources, grouped by tag (stable keys: re-seeding is idempotent)."""
    files = [
        Source(
            source_key=_file_key(uri),
            uri=uri,
            content_hash=file_sha256(p),
            path=p.resolve(),
        )
        for p, uri in zip(bundle.files, _file_uris(bundle), strict=True)
    ]
    urls = [
        Source(
            source_key=f"am_url:{url}",
            uri=url,
            content_hash=hashlib.sha256(url.encode()).hexdigest(),
            path=Path(urlsplit(url).hostname or "url"),
            record=(url, f"Account manager link: {url}"),
        )
        for url in bundle.urls
    ]
    prompts = []
    for text in bundle.prompts:
        digest = hashlib.sha256(text.strip().encode()).hexdigest()
        prompts.append(
            Source(
                source_key=f"am_prompt:{org_id}:{digest[:16]}",
                uri=f"am-prompt:{digest[:16]}",
                content_hash=digest,
                path=Path(f"prompt-{digest[:8]}"),
                record=(_prompt_title(text), text.strip()),
            )
        )
    return {SourceTag.AM_FILE: files, SourceTag.AM_URL: urls, SourceTag.AM_PROMPT: prompts}


def _prompt_title(text: str) -> str:
    first = " ".join(text.split())[:60]
    return f"AM prompt: {first}"


def seed_bundle(
    bundle: SeedBundle,
    org_id: str,
    *,
    registry: SqlRegistry,
    store: VectorStore,
    embedder: Embedder,
    extract_file: Callable[[Source], ExtractedDocument],
    actor: str = "system",
) -> BatchReport:
    """Check the bundle (and the room left in the org's bundle), then store each input as a
    tagged document (unchanged ones skipped)."""
    bundle.check()
    registry.people.get_org(org_id)
    check_room(bundle, registry, org_id)
    collection = registry.catalog.ensure_collection(
        org_id, SEED_COLLECTION, "Account-manager inputs for research"
    )
    report = BatchReport()

    def extract_keeping_uri(source: Source) -> ExtractedDocument:
        # A file is shown by the URI it came with, not by where it was read from.
        return replace(extract_file(source), uri=source.uri)

    for tag, sources in bundle_sources(bundle, org_id).items():
        if not sources:
            continue
        plan = plan_ingest(sources, registry, org_id)
        target = IngestTarget(
            org_id=org_id,
            collection_id=collection.id,
            collection_path=collection.path,
            status=DocStatus.APPROVED,
            audience=SEED_AUDIENCE,
            source_tag=tag.value,
            actor=actor,
        )
        report.merge(
            index_batch(
                plan.work,
                target,
                store=store,
                registry=registry,
                embedder=embedder,
                extract_file=extract_keeping_uri,
            )
        )
    return report


def list_seeds(registry: SqlRegistry, org_id: str) -> list[DocRecord]:
    """The org's current (approved) seed inputs, files, URLs and prompts."""
    return [
        d
        for d in registry.documents.list_documents(
            org_id, statuses=[DocStatus.APPROVED.value], collection=SEED_COLLECTION
        )
        if d.source_tag in {t.value for t in SEED_TAGS}
    ]

"""The flows' Prefect tasks take values, and retry transient faults only.

Each task of ingest, research and review is inspected: its parameters are values (ids, paths,
models, ``Settings``), never a live registry, store, embedder or callable. Then real flow runs
under Prefect's test harness: a fetch that times out once, a model that answers 529 once and a
store that is busy once are retried and recover; an SSRF block and a 400 are not retried.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import types
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from core.errors import StoreBusy
from core.models import Role
from core.settings import Settings
from sinks.connect import open_registry, open_vector_store
from tasks.ingest import steps as ingest_steps
from tasks.research import steps as research_steps
from tasks.research.fetch import FetchError, FetchResult, UnsafeUrl, check_url
from tasks.review import steps as review_steps
from tests.anthropic_mock import api_error, message

pytestmark = pytest.mark.integration

VALUE_TYPES = (str, int, float, bool, bytes, type(None), Path, date)


def _is_value_type(tp: Any, seen: set[Any]) -> bool:
    """A type whose instances are plain values: primitives, pydantic models, dataclasses of
    values, and containers of them."""
    if tp in seen or tp is typing.Any:  # Any: JSON-shaped data (a payload, a report's meta)
        return True
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return True
    if origin is not None:
        if origin in (typing.Union, types.UnionType, list, tuple, dict, set, frozenset) or (
            inspect.isclass(origin) and origin.__module__ == "collections.abc"
            and origin.__name__ in ("Sequence", "Mapping")
        ):  # fmt: skip
            return all(_is_value_type(a, seen) for a in typing.get_args(tp) if a is not Ellipsis)
        return False
    if not inspect.isclass(tp):
        return False
    if issubclass(tp, VALUE_TYPES) or issubclass(tp, BaseModel) or issubclass(tp, Exception):
        return True
    if dataclasses.is_dataclass(tp):
        seen = seen | {tp}
        hints = typing.get_type_hints(tp)
        return all(_is_value_type(hints[f.name], seen) for f in dataclasses.fields(tp))
    return False


STEP_MODULES = (ingest_steps, research_steps, review_steps)


def prefect_tasks() -> list[Any]:
    from prefect import Task

    return [
        obj for module in STEP_MODULES for obj in vars(module).values() if isinstance(obj, Task)
    ]


def test_every_flow_task_takes_only_values() -> None:
    tasks = prefect_tasks()
    assert {t.name for t in tasks} >= {
        "discover-sources", "plan-ingest", "extract-batch", "index-batch", "fetch-page",
        "gather-corpus", "synthesize-drafts", "persist-drafts", "list-pending-reviews",
        "read-draft-texts", "apply-review-decisions",
    }  # fmt: skip
    live = []
    for task in tasks:
        hints = typing.get_type_hints(task.fn)
        for name in inspect.signature(task.fn).parameters:
            if not _is_value_type(hints[name], set()):
                live.append(f"{task.name}({name}: {hints[name]})")
    assert live == []


def test_the_value_check_catches_live_resources() -> None:
    from collections.abc import Callable

    from sinks.registry import SqlRegistry
    from sinks.vectors import VectorStore

    for tp in (SqlRegistry, VectorStore, Callable[[str], str], list[SqlRegistry]):
        assert not _is_value_type(tp, set()), tp


# --- real flow runs ---------------------------------------------------------------------------

ORG, AM = "larch", "amy"
HOME_URL = "https://larch.example/"
HOME_TEXT = "Larch Cycles builds folding bikes in Leeds."


@pytest.fixture
def seeded(embedder: Any) -> Settings:
    """Org ``larch`` with its AM and a seed bundle: a prompt and the homepage URL."""
    from tasks.ingest.extract import file_to_document
    from tasks.research.seed import SeedBundle, seed_bundle

    settings = Settings()
    with open_registry(settings) as registry, open_vector_store(settings) as store:
        registry.people.ensure_user("root", Role.SUPERADMIN)
        registry.people.ensure_user(AM, Role.ACCOUNT_MANAGER)
        registry.people.ensure_org(ORG, "Larch Cycles", am_user_id=AM)
        seed_bundle(
            SeedBundle(urls=(HOME_URL,), prompts=("Larch Cycles sells the Fold 3 for 950 EUR.",)),
            ORG, registry=registry, store=store, embedder=embedder,
            extract_file=lambda s: file_to_document(s.path),
        )  # fmt: skip
    return settings


def _research(**kw: Any) -> dict[str, Any]:
    from flows.research import research

    return research(org=ORG, client_name="Larch Cycles", reviewer=AM, review_timeout_s=0, **kw)


@contextmanager
def scripted_fetch(monkeypatch: pytest.MonkeyPatch, homepage: str) -> Iterator[dict[str, int]]:
    """``safe_get`` for the run: the homepage fails once with a timeout, then answers; an
    internal homepage is refused by the real SSRF guard; other pages answer at once."""
    calls: dict[str, int] = {}

    def fake(url: str, **_: Any) -> FetchResult:
        calls[url] = calls.get(url, 0) + 1
        if url == homepage:
            # An internal address raises UnsafeUrl, as the real fetch would (names resolve to
            # a public documentation address here: the tests have no network).
            check_url(url, resolver=lambda _host, _port: ["93.184.215.14"])
            if calls[url] == 1:
                raise FetchError(f"fetching {url!r} took longer than 10s", url=url,
                                 transient=True)  # fmt: skip
            body = f"<html><body><p>{HOME_TEXT}</p></body></html>"
        else:
            body = "<html><body><p>No results.</p></body></html>"
        return FetchResult(url=url, final_url=url, status_code=200, content_type="text/html",
                           text=body, bytes_read=len(body), truncated=False)  # fmt: skip

    monkeypatch.setattr(research_steps, "safe_get", fake)
    yield calls


def test_a_fetch_that_times_out_once_is_retried_and_recovers(
    prefect_harness: None, seeded: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    with scripted_fetch(monkeypatch, HOME_URL) as calls:
        report = _research(offline=False)
    assert calls[HOME_URL] == 2  # one timeout, one answer
    assert all(n == 1 for url, n in calls.items() if url != HOME_URL)
    assert len(report["doc_ids"]) == 4
    assert not any("could not fetch" in n or "took longer" in n for n in report["notes"])


def test_an_ssrf_block_is_not_retried(
    prefect_harness: None, embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tasks.ingest.extract import file_to_document
    from tasks.research.seed import SeedBundle, seed_bundle

    internal = "http://169.254.169.254/latest/"
    settings = Settings()
    # A URL stored before seeds were checked when stored (they are now): the fetch refuses it.
    monkeypatch.setattr("tasks.research.seed.check_url_shape", lambda url, **_: None)
    with open_registry(settings) as registry, open_vector_store(settings) as store:
        registry.people.ensure_user(AM, Role.ACCOUNT_MANAGER)
        registry.people.ensure_org(ORG, "Larch Cycles", am_user_id=AM)
        seed_bundle(SeedBundle(urls=(internal,), prompts=("Focus on folding bikes.",)), ORG,
                    registry=registry, store=store, embedder=embedder,
                    extract_file=lambda s: file_to_document(s.path))  # fmt: skip
    with scripted_fetch(monkeypatch, internal) as calls:
        report = _research(offline=False)
    assert calls[internal] == 1  # refused once, never retried
    assert any(internal in n for n in report["notes"]), report["notes"]  # noted, skipped
    with pytest.raises(UnsafeUrl):
        check_url(internal)


def _drafts_reply(request_body: dict[str, Any]) -> str:
    """Four minimal valid drafts citing the first corpus id the request shows."""
    user = request_body["messages"][0]["content"]
    cite = re.search(r"\[((?:doc|url|search):[^\]]+)\]", user).group(1)  # type: ignore[union-attr]
    names = ("brand-voice-playbook.md", "product-context.md", "compliance-notes.md",
             "key-contacts-extracted.md")  # fmt: skip
    docs = [
        {"filename": n, "title": n, "content": f"# {n}\n\nFrom the brief [{cite}].\n\n---\n"
                                               f"## Citations\n- [{cite}] brief\n"}
        for n in names
    ]  # fmt: skip
    return json.dumps({"documents": docs})


@contextmanager
def scripted_claude(monkeypatch: pytest.MonkeyPatch, first: Any) -> Iterator[list[Any]]:
    """Claude (the real SDK over a mock transport): ``first`` answers the first request, a
    valid set of drafts every later one."""
    import anthropic
    import httpx2

    seen: list[Any] = []

    def handler(request: Any) -> Any:
        seen.append(request)
        if len(seen) == 1:
            return first
        return message(_drafts_reply(json.loads(request.content)))

    real = anthropic.Anthropic

    def client(*_: Any, **kw: Any) -> Any:
        kw["http_client"] = httpx2.Client(transport=httpx2.MockTransport(handler))
        return real(**kw)

    monkeypatch.setenv("KBFLOW_ANTHROPIC_API_KEY", "sk-test")
    monkeypatch.setattr(anthropic, "Anthropic", client)
    yield seen


def test_an_overloaded_model_is_retried_and_recovers(
    prefect_harness: None, seeded: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    with scripted_claude(monkeypatch, api_error(529, "overloaded_error")) as requests:
        report = _research(offline=True)
    assert len(requests) == 2  # the 529, then the retry of the task
    assert len(report["doc_ids"]) == 4 and report["synthesizer"].startswith("claude"), report


def test_a_bad_request_is_not_retried(
    prefect_harness: None, seeded: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from core.errors import SynthesisFailed

    with (
        scripted_claude(monkeypatch, api_error(400, "invalid_request_error")) as requests,
        pytest.raises(SynthesisFailed, match="not retried"),
    ):
        _research(offline=True)
    assert len(requests) == 1


def test_a_busy_store_is_retried_and_the_ingest_recovers(
    prefect_harness: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.ingest import ingest

    (tmp_path / "a.md").write_text("# Returns\n\nBikes may be returned within thirty days.\n")
    with open_registry(Settings()) as registry:
        registry.people.ensure_org(ORG)
    real = ingest_steps.open_vector_store
    opened: list[int] = []

    @contextmanager
    def busy_once(settings: Settings) -> Iterator[Any]:
        opened.append(1)
        if len(opened) == 1:
            raise StoreBusy("the vector store is busy: another kbflow process holds it")
        with real(settings) as store:
            yield store

    monkeypatch.setattr(ingest_steps, "open_vector_store", busy_once)
    report = ingest(paths=[str(tmp_path / "a.md")], org=ORG, collection="kb")
    assert report["documents"] == 1 and len(opened) == 2

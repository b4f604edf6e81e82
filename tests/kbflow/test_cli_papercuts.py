"""Issue 44's CLI papercuts: counts whose noun agrees with the number, collections shown by
path (ids after), and a collection's display name accepted wherever its path is."""

from __future__ import annotations

import pytest

from core.errors import ConfigError, NotFound
from kbflow.cli.common import counted
from tests.kbflow.support import data, flat, kb, ok


def _org(org: str = "acme") -> None:
    ok("users", "add", "root", "--role", "superadmin")
    ok("orgs", "create", org, "--as", "root")


def _collection(name: str, *more: str, org: str = "acme") -> None:
    ok("collections", "create", name, "--org", org, "--description", name, "--as", "root", *more)


# --- 1. a count's noun agrees with it ---------------------------------------------------------


def test_counted_agrees_with_the_number() -> None:
    assert counted(0, "draft") == "0 drafts"
    assert counted(1, "draft") == "1 draft"
    assert counted(2, "draft") == "2 drafts"
    assert counted(1, "query", "queries") == "1 query"
    assert counted(3, "query", "queries") == "3 queries"
    assert counted(10_000, "item", grouped=True) == "10,000 items"


def test_the_ingest_bar_of_one_file_says_one_document(monkeypatch: pytest.MonkeyPatch) -> None:
    """The progress bar said "ingest 1 documents"."""
    import io

    from rich.console import Console

    from kbflow import render

    screen = Console(file=io.StringIO(), force_terminal=True, width=100)
    monkeypatch.setattr(render, "err_console", screen)
    with render.ingest_progress() as listener:
        assert listener is not None
        listener("ingest", 1, 1)
    drawn = screen.file.getvalue()  # type: ignore[attr-defined]
    assert "ingest 1 document " in drawn and "1 documents" not in drawn, drawn


def test_research_with_one_draft_says_one_draft(monkeypatch: pytest.MonkeyPatch) -> None:
    import flows.research
    from core.contracts import DraftOut, ResearchReport

    report = ResearchReport(
        synthesis_run_id="run-1",
        budget_exceeded=False,
        documents=[DraftOut(filename="01_company.md", title="Company", content="…")],
        doc_ids=["doc-1"],
        consumed_tokens=1,
        synthesizer="extractive",
    )
    monkeypatch.setattr(flows.research, "research", lambda **_: report)
    _org("acme-one")

    said = flat(ok("research", "--org", "acme-one", "--client-name", "Acme", "--as", "root"))

    assert "(extractive, 1 token): 1 draft, 1 pending review" in said


def test_moves_and_deletes_count_documents_without_a_hedged_plural() -> None:
    _org()
    _collection("library")
    said = flat(ok("collections", "delete", "library", "--org", "acme", "--as", "root"))
    assert "0 documents moved" in said  # none moved: plural, as before
    _collection("archive")
    said = flat(ok("collections", "move", "archive", "--org", "acme", "--as", "root"))
    assert "0 documents re-filed" in said and "document(s)" not in said


# --- 2. and 3. collections are shown by path, their ids after ---------------------------------


def test_collections_create_prints_the_path_then_the_id() -> None:
    _org()
    made = data("collections", "create", "library", "--org", "acme", "--description", "Books",
                "--as", "root")  # fmt: skip
    assert set(made) == {"id", "name", "path", "description", "parent_id"}  # --json unchanged

    said = flat(ok("collections", "create", "hr", "--parent", "library", "--org", "acme",
                   "--description", "HR", "--as", "root"))  # fmt: skip

    assert said == f"created collection library/hr (id {made['id'] + 1})"


def test_agents_allow_prints_collection_paths() -> None:
    _org()
    _collection("library")
    ok("agents", "create", "bot", "--org", "acme", "--as", "root")
    ids = {c["path"]: c["id"] for c in data("collections", "list", "--org", "acme")}

    said = flat(ok("agents", "allow", "bot", "library", "default", "--as", "root"))

    assert said == (f"bot may read: default (id {ids['default']}), library (id {ids['library']})")
    said = flat(ok("agents", "disallow", "bot", "library", "--as", "root"))
    assert said == f"bot may read: default (id {ids['default']})"


# --- 4. a collection's display name is accepted where its path is -----------------------------


def test_the_default_collection_is_accepted_by_its_display_name() -> None:
    _org()
    _collection("library")
    ok("agents", "create", "bot", "--org", "acme", "--as", "root")
    ids = {c["path"]: c["id"] for c in data("collections", "list", "--org", "acme")}

    # The list shows the name "Default"; that name, in any case, is the path `default`.
    assert any(c["name"] == "Default" for c in data("collections", "list", "--org", "acme"))
    assert "default (id" in flat(ok("agents", "allow", "bot", "Default", "--as", "root"))
    assert "library (id" in flat(ok("agents", "allow", "bot", "LIBRARY", "--as", "root"))
    ok("collections", "describe", "DEFAULT", "Anything else.", "--org", "acme", "--as", "root")
    assert data("docs", "list", "--org", "acme", "--collection", "Default") == []
    # The forms accepted before still mean what they meant: a path, an id.
    assert "default (id" in flat(ok("agents", "allow", "bot", "default", "--as", "root"))
    said = flat(ok("agents", "allow", "bot", str(ids["library"]), "--as", "root"))
    assert "library (id" in said


def test_an_unknown_collection_name_is_refused_with_the_valid_paths() -> None:
    _org()
    _collection("library")
    ok("agents", "create", "bot", "--org", "acme", "--as", "root")

    for args in (
        ("agents", "allow", "bot", "Nope", "--as", "root"),
        ("docs", "list", "--org", "acme", "--collection", "No Such Shelf"),
    ):
        result = kb(*args)
        assert result.exit_code == 1, result.output
        said = flat(result)
        assert "'acme'" in said and "default, library" in said, said


def test_ingest_files_into_a_collection_named_by_its_display_name(tmp_path: object) -> None:
    from pathlib import Path

    folder = Path(str(tmp_path)) / "docs"
    folder.mkdir()
    (folder / "a.md").write_text("# Leave\n\nTwenty days of paid leave a year.\n")
    _org()

    ok("ingest", str(folder), "--org", "acme", "--collection", "Default", "--wait")

    assert [d["collection_path"] for d in data("docs", "list", "--org", "acme")] == ["default"]
    refused = kb("ingest", str(folder), "--org", "acme", "--collection", "Bad Path")
    assert refused.exit_code == 1
    assert "its paths: default" in flat(refused) and "not valid" in flat(refused)


def test_a_name_is_resolved_only_when_unambiguous() -> None:
    from core.settings import Settings
    from sinks.connect import open_registry

    _org()
    _collection("policies")
    _collection("teams")
    _collection("hr", "--parent", "policies")
    _collection("hr", "--parent", "teams")
    with open_registry(Settings()) as registry:
        catalog = registry.catalog
        # A valid path is taken as it is, as before: known or not (ingest makes new ones).
        assert catalog.collection_path("acme", "hr") == "hr"
        assert catalog.get_collection("acme", "policies/hr").path == "policies/hr"
        assert catalog.collection_path("acme", "Policies/HR") == "policies/hr"
        with pytest.raises(ConfigError, match=r"ambiguous .* policies/hr, teams/hr"):
            catalog.get_collection("acme", "hr")
        with pytest.raises(ConfigError, match=r"ambiguous .* policies/hr, teams/hr"):
            catalog.collection_path("acme", "HR")
        with pytest.raises(NotFound, match=r"default, policies, policies/hr, teams, teams/hr"):
            catalog.get_collection("acme", "nope")


# --- 5. seeding says what it stored, and lists URIs whole ---------------------------------------


def test_seed_names_each_input_it_stored_and_seed_list_shows_whole_uris() -> None:
    """Issue 44: `kbflow seed` of several inputs printed only "seeded 9 new input(s)", and
    `seed list` cut URIs at 60 characters."""
    _org()
    ok("users", "add", "amy", "--role", "account_manager", "--as", "root")
    ok("orgs", "assign-am", "acme", "amy", "--as", "root")
    long_url = "https://acme.example/" + "/".join(["a-rather-long-path-segment"] * 4)
    press = "https://acme.example/press"
    said = flat(ok("seed", "--org", "acme", "--as", "amy", "--url", long_url, "--url", press,
                   "--prompt", "Focus on commuters."))  # fmt: skip
    assert "seeded 3 new inputs for acme" in said
    assert f"url {long_url}" in said and "url https://acme.example/press" in said
    assert "prompt " in said
    listed = flat(ok("seed", "list", "--org", "acme", "--as", "amy"))
    assert long_url in listed


def test_review_code_says_the_form_takes_a_signed_proof_not_the_code() -> None:
    """The form's field is "Your decision proof" and a bare code typed there is refused; the
    command told people to type the code into a "Your review code" field that no longer is."""
    _org()
    ok("users", "add", "amy", "--role", "account_manager", "--as", "root")
    ok("orgs", "assign-am", "acme", "amy", "--as", "root")
    said = flat(ok("review", "code", "--org", "acme", "--as", "amy"))
    assert '"Your decision proof"' in said and "sign_decisions" in said
    assert "Type it into" not in said and "review inbox" in said

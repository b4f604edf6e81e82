"""A draft's Citations footer: taken off before chunking, kept as entries; tags resolved from
the citing document's own entries only."""

from __future__ import annotations

from core.models import ExtractedDocument, SourceRef
from tasks.text.chunk import document_to_chunks, markdown_to_sections
from tasks.text.citations import (
    cited_sources,
    render_footer,
    split_citation_footer,
    with_titles,
)

DRAFT = """# Key contacts — Acme

## People and roles

- Ana Diaz, CEO, ana@acme.example [doc:3f2a]
- Support hours are on the site [url:https://acme.example/help?q=[1]]

## Escalation

- Call the on-call line [doc:3f2a]

---
## Citations
- [doc:3f2a] Team sheet.xlsx
- [url:https://acme.example/help?q=[1]] Acme help   centre
- [search:"acme" tone OR voice]
"""


def markdown_document(text: str) -> ExtractedDocument:
    return ExtractedDocument(
        title="Key contacts",
        uri="kb://acme/key-contacts-extracted.md",
        sections=tuple(markdown_to_sections(text, title="Key contacts")),
        source_format="md",
    )


def test_the_footer_is_taken_off_before_chunking_and_kept_as_entries() -> None:
    document, refs = split_citation_footer(
        markdown_document(DRAFT), {"doc:3f2a": "upload:acme/team.xlsx"}
    )
    assert refs == (
        SourceRef("doc:3f2a", "Team sheet.xlsx", "upload:acme/team.xlsx"),
        SourceRef(
            "url:https://acme.example/help?q=[1]",
            "Acme help centre",
            "https://acme.example/help?q=[1]",
        ),
        SourceRef('search:"acme" tone OR voice', 'Web search: "acme" tone OR voice'),
    )
    assert [s.heading_path for s in document.sections] == [
        ("Key contacts — Acme", "People and roles"),
        ("Key contacts — Acme", "Escalation"),
    ]
    assert document.sections[-1].text == "- Call the on-call line [doc:3f2a]"  # the rule went
    texts = [c.text for c in document_to_chunks("d", document)]
    assert texts and not [t for t in texts if "Team sheet.xlsx" in t or "Citations" in t]


def test_a_document_without_a_real_footer_is_left_as_it_is() -> None:
    plain = markdown_document("# Notes\n\n## Citations\n\nWe cite sources carefully.\n")
    assert split_citation_footer(plain) == (plain, ())
    not_last = markdown_document("# Notes\n\n## Citations\n- [doc:1] A\n\n## After\n\nMore text.\n")
    assert split_citation_footer(not_last) == (not_last, ())
    assert split_citation_footer(markdown_document("")) == (markdown_document(""), ())


def test_a_footer_only_document_has_no_chunks_left() -> None:
    document, refs = split_citation_footer(markdown_document("---\n## Citations\n- [doc:1] A\n"))
    assert refs == (SourceRef("doc:1", "A"),)
    assert document_to_chunks("d", document) == []


def test_tags_resolve_from_the_documents_own_entries_and_nothing_else() -> None:
    refs = (
        SourceRef("doc:3f2a", "Team sheet.xlsx", "upload:acme/team.xlsx"),
        SourceRef("doc:3f2a-long", "Another sheet", None),
    )
    text = (
        "Ana [doc:3f2a] and Bo [doc:3f2a-long], again [doc:3f2a]; a look-alike [doc:3f2b], "
        "a prefix [doc:3f2], an id we never saw [doc:77aa], a page [url:https://x.example/a], "
        "a script [url:javascript:alert(1)], a search [search:acme tone]."
    )
    assert cited_sources(text, refs) == [
        refs[0],
        refs[1],
        SourceRef("url:https://x.example/a", "https://x.example/a", "https://x.example/a"),
        SourceRef("search:acme tone", "Web search: acme tone", None),
    ]
    assert cited_sources(text, ()) == [  # a doc: id is never looked up
        SourceRef("url:https://x.example/a", "https://x.example/a", "https://x.example/a"),
        SourceRef("search:acme tone", "Web search: acme tone", None),
    ]


def test_people_read_titles_and_the_footer_renders_back() -> None:
    refs = (SourceRef("doc:3f2a", "Team sheet.xlsx", "upload:acme/team.xlsx"),)
    assert with_titles("Ana, CEO [doc:3f2a]", refs) == "Ana, CEO [Team sheet.xlsx]"
    footer = render_footer(refs)
    assert footer == "---\n## Citations\n- [doc:3f2a] Team sheet.xlsx\n"
    again = split_citation_footer(markdown_document("# T\n\nBody [doc:3f2a].\n\n" + footer))
    assert again[1] == (SourceRef("doc:3f2a", "Team sheet.xlsx"),)
    assert render_footer(()) == ""


def test_a_source_ref_round_trips_through_its_dict() -> None:
    ref = SourceRef("url:https://a.example/x]y", "A", "https://a.example/x]y")
    assert ref.to_dict() == {
        "tag": "[url:https://a.example/x]y]",
        "title": "A",
        "uri": "https://a.example/x]y",
    }
    assert SourceRef.from_dict(ref.to_dict()) == ref

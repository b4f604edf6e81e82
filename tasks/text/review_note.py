"""A note for the reviewer in a draft's Markdown: said to the account manager, never to agents.

The offline synthesizer opens each draft with a quoted banner (``> Evidence pack, assembled
without a model: … Edit before approving.``). It is about the draft, not about the client, so it
is taken off the text before the text is chunked (as the Citations footer is): the registry
keeps it beside the document (``review_note``), the inbox shows it on the draft's page, and
search, answers and MCP never see it, whether the draft is approved as it is or edited with
the banner left in.
"""

from __future__ import annotations

NOTE_OPENING = "> Evidence pack, assembled without a model:"
"""How a reviewer's note starts: the first line of a quoted paragraph."""


def review_note_banner(text: str) -> str:
    """The quoted paragraph a draft opens with to say ``text`` to its reviewer."""
    return f"{NOTE_OPENING} {text}"


def split_review_note(markdown: str) -> tuple[str, str | None]:
    """``markdown`` without its reviewer's note, and the note (its plain text), or None.

    The note is the quoted paragraph (consecutive ``>`` lines) whose first line starts with
    `NOTE_OPENING`, wherever it stands (an edit may have moved it); every such paragraph goes,
    with one blank line around it, and the first one's text is returned.
    """
    lines = markdown.splitlines(keepends=True)
    kept: list[str] = []
    note: str | None = None
    i = 0
    while i < len(lines):
        if not lines[i].lstrip().startswith(NOTE_OPENING):
            kept.append(lines[i])
            i += 1
            continue
        end = i
        while end < len(lines) and lines[end].lstrip().startswith(">"):
            end += 1
        if note is None:
            quoted = (line.lstrip()[1:].strip() for line in lines[i:end])
            note = " ".join(" ".join(quoted).split())
        i = end
        if kept and not kept[-1].strip():
            while i < len(lines) and not lines[i].strip():
                i += 1  # the blank lines after it go, the one before it stays
    if note is None:
        return markdown, None
    return "".join(kept), note

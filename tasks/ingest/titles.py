"""A document's title: what the file says it is called, before what the file is called.

`document_title` picks it (metadata, then first heading, then the file name's stem);
`metadata_title` reads the title a format stores apart from its text: a PDF's ``Title``, an
Office file's core ``dc:title``, an HTML page's ``<title>``. Nothing here touches the network.
"""

from __future__ import annotations

import logging
import re
import zipfile
from pathlib import Path

logger = logging.getLogger(__name__)

MAX_TITLE_CHARS = 200
"""A longer "title" is a paragraph or a pasted abstract, not a name."""

_CORE_XML = "docProps/core.xml"
_CORE_XML_MAX_BYTES = 1 << 20  # a core.xml holds a dozen short fields; larger is not one
_DC_TITLE = "{http://purl.org/dc/elements/1.1/}title"

# Titles authoring tools fill in by themselves: they name the template, not the document.
_PLACEHOLDER = re.compile(
    r"(?:untitled(?:\s+document)?|no\s+title|none|null|"
    r"(?:document|presentation|book)\s*\d*|powerpoint\s+presentation)",
    re.IGNORECASE,
)
# "Microsoft Word - foo.docx": the printer driver's job name, i.e. a file name.
_JOB_NAME = re.compile(r"^microsoft\s+(?:word|powerpoint|excel)\b", re.IGNORECASE)
# A file name or path: "report-v2.docx", "C:\Users\me\x.pdf".
_FILE_NAME = re.compile(
    r"(?:^[a-z]:\\|^/|\.(?:docx?|pptx?|xlsx?|pdf|rtf|odt|txt|html?|indd)$)", re.I
)
# Between a page's own title and its site's name: "Duck - Wikipedia", "Pricing | Acme".
_SITE_SEPARATORS = (" - ", " | ", " – ", " — ")


def document_title(path: Path, *, metadata: str | None, heading: str | None) -> str:
    """The title a document is stored and cited under, in this order of preference:

    1. ``metadata``: the title the file stores apart from its text (`metadata_title`), unless
       it is junk (`usable_title`). When it is the first heading plus a site's name
       ("Duck - Wikipedia" over a page headed "Duck"), the heading is taken instead.
    2. ``heading``: the document's first title or heading (Markdown ``# ...``, Docling's first
       title or section header), unless it is junk.
    3. The file name's stem, as a last resort.

    Whitespace runs in the chosen title become one space.
    """
    meta = usable_title(metadata, path)
    head = usable_title(heading)  # a heading that repeats the file name is still a heading
    if meta and head and meta != head:
        for sep in _SITE_SEPARATORS:
            if meta.startswith(head + sep):
                return head
    return meta or head or path.stem


def usable_title(candidate: str | None, path: Path | None = None) -> str | None:
    """``candidate`` with its whitespace collapsed, or None when it names nothing: empty, a
    tool's placeholder ("Untitled", "Document1", "PowerPoint Presentation"), a printer job
    name ("Microsoft Word - foo.docx"), a file path or name (``path``'s own, with or without
    its suffix, when given), no letters at all (a page number, a date), or over
    `MAX_TITLE_CHARS` characters."""
    if not candidate:
        return None
    title = " ".join(candidate.replace("\x00", " ").replace("\ufeff", " ").split())
    if not title or len(title) > MAX_TITLE_CHARS:
        return None
    if not any(ch.isalpha() for ch in title):
        return None
    if _PLACEHOLDER.fullmatch(title) or _JOB_NAME.match(title) or _FILE_NAME.search(title):
        return None
    if path is not None and title.casefold() in {path.name.casefold(), path.stem.casefold()}:
        return None
    return title


def metadata_title(path: Path, fmt: str, data: bytes | None = None) -> str | None:
    """The title stored in the file apart from its text, or None: a PDF's ``Title`` (pdfium),
    DOCX, PPTX and XLSX core ``dc:title`` (``docProps/core.xml``), an HTML page's ``<title>``.

    ``data``: the file's bytes when held in memory (a text format). Unreadable metadata is no
    title (the text extraction reports a broken file); it never fails the extraction.
    """
    try:
        if fmt == "pdf":
            return _pdf_title(path)
        if fmt in ("docx", "pptx", "xlsx"):
            return _core_title(path)
        if fmt == "html":
            return _html_title(path.read_bytes() if data is None else data)
    except Exception as exc:  # metadata is optional: a broken file is the text path's to report
        logger.info("%s: no title read from its metadata: %s", path.name, exc)
    return None


def _pdf_title(path: Path) -> str | None:
    from tasks.ingest.pages import open_pdf

    pdf = open_pdf(path)
    try:
        return pdf.get_metadata_value("Title") or None
    finally:
        pdf.close()


def _core_title(path: Path) -> str | None:
    from lxml import etree

    with zipfile.ZipFile(path) as archive:
        try:
            info = archive.getinfo(_CORE_XML)
        except KeyError:
            return None
        if info.file_size > _CORE_XML_MAX_BYTES:
            return None
        raw = archive.read(info)
    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False)
    root = etree.fromstring(raw, parser)
    found = root.find(_DC_TITLE)
    return found.text if found is not None and found.text else None


def _html_title(data: bytes) -> str | None:
    from lxml import etree

    parser = etree.HTMLParser(no_network=True, remove_comments=True)
    root = etree.fromstring(data, parser)
    if root is None:
        return None
    found = root.find("head/title")  # the parser moves a stray <title> into <head>
    return "".join(found.itertext()) if found is not None else None

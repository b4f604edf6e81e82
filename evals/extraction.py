"""Extraction quality: how much of a reference text an extractor kept.

The measure is word-token recall: the share of the reference's word tokens (lower-cased
``\\w+`` runs, counted with multiplicity) that also occur in the extracted text. Markup of the
reference converter (image placeholders, link targets, table rules) is not text and is dropped.
Order and layout are not scored: this checks that nothing was lost, not how it is arranged.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.models import ExtractedDocument

_TOKEN = re.compile(r"\w+", re.UNICODE)


def word_tokens(text: str) -> Counter[str]:
    return Counter(t.lower() for t in _TOKEN.findall(text))


def reference_text(markdown: str) -> str:
    """The words of a reference Markdown file, without its converter's markup."""
    text = re.sub(r"<!--.*?-->", " ", markdown, flags=re.DOTALL)  # "<!-- image -->"
    text = re.sub(r"\]\([^)]*\)", "] ", text)  # link targets
    text = re.sub(r"^\s*\|?(\s*:?-{3,}:?\s*\|)+\s*$", " ", text, flags=re.MULTILINE)  # |---|
    return text


def document_text(doc: ExtractedDocument) -> str:
    """Title, heading paths and text: headings are kept, just not inside `Section.text`."""
    parts = [doc.title]
    for section in doc.sections:
        parts.extend(section.heading_path)
        parts.append(section.text)
    return "\n".join(parts)


def token_recall(reference: str, extracted: str) -> float:
    ref = word_tokens(reference)
    got = word_tokens(extracted)
    total = sum(ref.values())
    if not total:
        return 1.0
    return sum(min(n, got[t]) for t, n in ref.items()) / total


def groundtruth_for(source: Path, groundtruth_dir: Path) -> Path | None:
    """``<name>.<ext>.md`` or ``<stem>.md`` beside the sources, as the dataset names them."""
    for candidate in (groundtruth_dir / f"{source.name}.md", groundtruth_dir / f"{source.stem}.md"):
        if candidate.exists():
            return candidate
    return None


@dataclass
class RecallRow:
    name: str
    source_format: str
    method: str
    reference_tokens: int
    recall: float
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def method_of(doc: ExtractedDocument) -> str:
    """How the text was obtained, for the report: docling, native PDF, OCR or speech."""
    meta = doc.meta
    if meta.get("engine"):
        return f"speech ({meta['engine']})"
    if meta.get("ocr_engine") and doc.source_format != "pdf":
        return f"OCR ({meta['ocr_engine']})"
    if doc.source_format == "pdf":
        pipeline = f"docling {meta.get('pdf_pipeline', 'native')}"
        if meta.get("ocr_pages"):
            pipeline += f" + OCR ({meta['ocr_engine']}) on {len(meta['ocr_pages'])} page(s)"
        return pipeline
    if doc.source_format == "txt":
        return "plain text"
    return "docling"


def recall_row(source: Path, reference: Path, doc: ExtractedDocument, seconds: float) -> RecallRow:
    ref_text = reference_text(reference.read_text(encoding="utf-8"))
    return RecallRow(
        name=source.name,
        source_format=doc.source_format,
        method=method_of(doc),
        reference_tokens=sum(word_tokens(ref_text).values()),
        recall=round(token_recall(ref_text, document_text(doc)), 4),
        seconds=round(seconds, 3),
    )

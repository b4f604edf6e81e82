"""A Docling document as sections: walked in reading order, cut at every title or heading, with
lists as "- item" lines (a bullet glyph left in an item's text dropped: `tasks.ingest.bullets`),
tables as Markdown, charts as their data, and the page, slide or sheet each passage came from."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from core.models import Location, Section
from tasks.ingest.bullets import strip_bullet

if TYPE_CHECKING:
    from docling_core.types.doc import DoclingDocument, NodeItem, PictureItem


class _SectionBuilder:
    """Collects text blocks under the current heading path and cuts a section at each heading."""

    def __init__(self) -> None:
        self.sections: list[Section] = []
        self._first_title: str | None = None
        self._first_heading: str | None = None
        self._stack: list[tuple[int, str]] = []  # (level, heading text); a title is level 0
        self._blocks: list[str] = []
        self._heading_is_bare = False  # the innermost heading has no text (yet)
        self._location: Location | None = None

    def locate(self, location: Location | None) -> None:
        """Later blocks come from ``location`` (a new page, slide or sheet cuts a section)."""
        if location is not None and location != self._location:
            self._flush()
            if location.slide is not None or location.sheet is not None:
                # A slide or sheet stands alone: it does not sit under the previous one's title.
                if self._heading_is_bare:
                    self.sections.append(Section(self._path(), self._stack[-1][1], self._location))
                    self._heading_is_bare = False
                self._stack = []
            if location.sheet is not None:
                # The sheet's name heads everything on it, below any title (level -1), so its
                # chunks carry it in their heading path. It never names the whole workbook, and
                # an empty sheet yields no section (its name alone is not content).
                self._stack = [(-1, location.sheet)]
            self._location = location

    def heading(self, level: int, text: str) -> None:
        self._flush()
        if self._heading_is_bare and level <= self._stack[-1][0]:
            # A heading with neither text nor sub-headings: keep its words searchable.
            self.sections.append(Section(self._path(), self._stack[-1][1], self._location))
        while self._stack and self._stack[-1][0] >= level:
            self._stack.pop()
        self._stack.append((level, text))
        self._heading_is_bare = True
        if level == 0 and self._first_title is None:
            self._first_title = text
        if self._first_heading is None:
            self._first_heading = text

    @property
    def title(self) -> str | None:
        """The first title item; failing that, the first heading of any level."""
        return self._first_title or self._first_heading

    def block(self, text: str) -> None:
        if text.strip():
            self._blocks.append(text.strip())

    def finish(self) -> list[Section]:
        self._flush()
        if self._heading_is_bare:
            self.sections.append(Section(self._path(), self._stack[-1][1], self._location))
            self._heading_is_bare = False
        return self.sections

    def _path(self) -> tuple[str, ...]:
        return tuple(text for _level, text in self._stack)

    def _flush(self) -> None:
        if self._blocks:
            self.sections.append(Section(self._path(), "\n\n".join(self._blocks), self._location))
            self._blocks = []
            self._heading_is_bare = False


def docling_to_sections(
    doc: DoclingDocument, *, unit: str | None = None
) -> tuple[str | None, list[Section]]:
    """Walk the document body in reading order, cutting a section at every title or heading.

    ``unit`` says what an item's page number means: ``"page"`` (PDF), ``"slide"`` (PPTX) or
    None (no pages). Spreadsheet sheets are found from their groups.
    """
    builder = _SectionBuilder()
    _walk(doc, doc.body, builder, unit)
    return builder.title, builder.finish()


def _walk(doc: DoclingDocument, node: NodeItem, builder: _SectionBuilder, unit: str | None) -> None:
    from docling_core.types.doc import (
        ContentLayer,
        DocItemLabel,
        GroupLabel,
        ListItem,
        PictureItem,
        SectionHeaderItem,
        TableItem,
        TextItem,
        TitleItem,
    )

    for ref in node.children:
        child = ref.resolve(doc)
        if getattr(child, "content_layer", ContentLayer.BODY) != ContentLayer.BODY:
            continue
        builder.locate(_location_of(child, unit))
        if isinstance(child, TitleItem):
            if child.text.strip():
                builder.heading(0, child.text.strip())
        elif isinstance(child, SectionHeaderItem):
            if child.text.strip():
                builder.heading(max(child.level, 1), child.text.strip())
        elif _is_group(child, GroupLabel.LIST, GroupLabel.ORDERED_LIST) or isinstance(
            child, ListItem
        ):
            builder.block("\n".join(_list_lines(doc, child, depth=0)))
            continue  # _list_lines has consumed the children
        elif _is_group(child, GroupLabel.INLINE):
            builder.block(_inline_text(doc, child))
            continue
        elif isinstance(child, TableItem):
            builder.block(child.export_to_markdown(doc=doc))  # then its caption, if a child
        elif isinstance(child, PictureItem):
            # Text drawn inside a picture is noise without layout; keep only its captions, and
            # a chart's data series (Docling reads them from XLSX, PPTX and DOCX charts).
            for ref_in in child.children:
                inner = ref_in.resolve(doc)
                if getattr(inner, "label", None) in (DocItemLabel.CAPTION, DocItemLabel.FOOTNOTE):
                    builder.block(getattr(inner, "text", ""))
            for block in _chart_blocks(child):
                builder.block(block)
            continue
        elif isinstance(child, TextItem):
            builder.block(child.text)
        _walk(doc, child, builder, unit)


def _chart_blocks(picture: PictureItem) -> list[str]:
    """A chart's data as a label ("Bar chart data: Sales") and a Markdown table, if it has any.

    The table has one column per series (named in the header row) and one row per category.
    """
    from docling_core.types.doc import DoclingDocument

    meta = picture.meta
    chart = meta.tabular_chart if meta is not None else None
    if chart is None or not chart.chart_data.table_cells:
        return []
    scratch = DoclingDocument(name="chart")
    table = scratch.add_table(data=chart.chart_data).export_to_markdown(doc=scratch).strip()
    if not table:
        return []
    kind = "chart"
    if meta is not None and meta.classification is not None and meta.classification.predictions:
        kind = meta.classification.get_main_prediction().class_name.replace("_", " ")
        if not kind.endswith("chart"):
            kind += " chart"
    label = f"{kind[0].upper()}{kind[1:]} data" + (f": {chart.title}" if chart.title else "")
    return [label, table]


def _location_of(item: NodeItem, unit: str | None) -> Location | None:
    """The page, slide or sheet an item sits on, if the format has such units."""
    from docling_core.types.doc import GroupItem

    if isinstance(item, GroupItem) and item.label == "sheet":
        return Location(sheet=item.name)
    prov = getattr(item, "prov", None)
    if unit is None or not prov:
        return None
    return Location(page=prov[0].page_no) if unit == "page" else Location(slide=prov[0].page_no)


def _list_lines(doc: DoclingDocument, node: NodeItem, depth: int, number: int = 1) -> list[str]:
    """Render a list (group or single item) as "- item" / "1. item" lines, nested by indent."""
    from docling_core.types.doc import GroupLabel, ListItem

    if isinstance(node, ListItem):
        own = strip_bullet(node.text.strip())  # the item's marker says it already
        nested: list[str] = []
        for ref in node.children:
            child = ref.resolve(doc)
            if _is_group(child, GroupLabel.INLINE):
                own = (own + " " + _inline_text(doc, child)).strip()
            else:
                nested.extend(_list_lines(doc, child, depth + 1))
        marker = (node.marker.strip() or f"{number}.") if node.enumerated else "-"
        head = [f"{'  ' * depth}{marker} {own}"] if own else []
        return head + nested
    if _is_group(node, GroupLabel.LIST, GroupLabel.ORDERED_LIST):
        lines: list[str] = []
        for number, ref in enumerate(node.children, start=1):
            lines.extend(_list_lines(doc, ref.resolve(doc), depth, number))
        return lines
    text = getattr(node, "text", "") or _inline_text(doc, node)
    return [f"{'  ' * depth}{text.strip()}"] if text.strip() else []


def _is_group(node: NodeItem, *labels: Any) -> bool:
    from docling_core.types.doc import GroupItem

    return isinstance(node, GroupItem) and node.label in labels


def _inline_text(doc: DoclingDocument, node: NodeItem) -> str:
    """Join the pieces of an inline group (text split by bold, links, code spans)."""
    parts: list[str] = []
    for ref in node.children:
        child = ref.resolve(doc)
        text = getattr(child, "text", "")
        parts.append(text.strip() if text else _inline_text(doc, child))
    return " ".join(p for p in parts if p)

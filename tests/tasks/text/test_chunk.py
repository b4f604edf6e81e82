"""Chunking: ids, headings, the word cap, and that the chunks cover the text with exact overlap.

What ``section_to_texts`` promises, read from its implementation: the section's words are cut
into pieces (a paragraph that fits, else its sentences, else ``max_words`` slices of a sentence),
pieces are packed whole into chunks of at most ``max_words`` words, and each chunk after the
first starts with the last ``min(overlap_words, len(previous chunk))`` words of the previous
chunk, fewer only when the next piece would not fit otherwise (then that chunk is exactly
``max_words`` long). So, stripped of its overlap prefix, the chunks of a section concatenate to
the section's words, in order, each word once.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from core.errors import ConfigError
from core.models import ExtractedDocument, Section
from tasks.text.chunk import _render, _tokens, document_to_chunks, join_chunks, section_to_texts

PROPERTY = hsettings(max_examples=250, derandomize=True, database=None, deadline=None)


def doc(*sections: Section) -> ExtractedDocument:
    return ExtractedDocument(title="T", uri="test://t", sections=sections, source_format="md")


def words(n: int, prefix: str = "w") -> str:
    return " ".join(f"{prefix}{i}" for i in range(n))


# --- examples ----------------------------------------------------------------------------------


def test_chunk_ids_are_sequential_across_sections() -> None:
    document = doc(
        Section(("Intro",), words(50, "a")),
        Section((), ""),
        Section(("Policies", "Leave"), words(70, "b")),
    )
    chunks = document_to_chunks("doc7", document, max_words=20, overlap_words=5)
    assert len(chunks) > 4
    assert [c.chunk_id for c in chunks] == [f"doc7:{i}" for i in range(len(chunks))]
    assert [c.chunk_index for c in chunks] == list(range(len(chunks)))
    assert len({c.chunk_id for c in chunks}) == len(chunks)
    assert {c.doc_id for c in chunks} == {"doc7"}


def test_heading_path_is_kept_and_chunks_never_straddle_sections() -> None:
    document = doc(
        Section(("Intro",), words(30, "a")), Section(("Policies", "Leave"), words(30, "b"))
    )
    chunks = document_to_chunks("d", document, max_words=12, overlap_words=4)
    for chunk in chunks:
        prefixes = {w[0] for w in chunk.text.split()}
        assert prefixes in ({"a"}, {"b"})
        assert chunk.heading_path == (("Intro",) if prefixes == {"a"} else ("Policies", "Leave"))
    assert chunks[-1].embed_text.startswith("Policies > Leave\n")


def test_every_chunk_respects_the_word_cap() -> None:
    long_sentence = words(95, "s") + "."
    text = "\n\n".join([words(7, "p"), long_sentence + " Short one. " + words(40, "t"), "x y"])
    for max_words, overlap in ((10, 0), (10, 9), (25, 5), (1, 0)):
        chunks = document_to_chunks("d", doc(Section((), text)), max_words=max_words,
                                    overlap_words=overlap)  # fmt: skip
        assert chunks
        assert all(1 <= len(c.text.split()) <= max_words for c in chunks)


def test_a_short_document_is_one_chunk_with_the_same_words() -> None:
    text = "First paragraph here.\n\nSecond   paragraph\twith tabs."
    [chunk] = document_to_chunks("d", doc(Section(("H",), text)))
    assert chunk.text.split() == text.split()


def test_empty_sections_give_no_chunks() -> None:
    assert document_to_chunks("d", doc(Section(("H",), "  \n\n \t "))) == []
    assert document_to_chunks("d", doc()) == []


def test_paragraphs_that_fit_are_packed_whole() -> None:
    paras = [words(6, "a"), words(6, "b"), words(6, "c")]
    texts = section_to_texts(Section((), "\n\n".join(paras)), max_words=13, overlap_words=0)
    assert texts == [paras[0] + "\n\n" + paras[1], paras[2]]


def test_overlap_repeats_the_tail_of_the_previous_chunk() -> None:
    paras = [words(8, "a"), words(8, "b"), words(8, "c")]
    texts = section_to_texts(Section((), "\n\n".join(paras)), max_words=12, overlap_words=3)
    assert texts == [paras[0], "a5 a6 a7\n\n" + paras[1], "b5 b6 b7\n\n" + paras[2]]


def test_overlap_shrinks_so_a_full_piece_fits() -> None:
    text = words(5, "a") + "\n\n" + words(9, "b")
    texts = section_to_texts(Section((), text), max_words=10, overlap_words=4)
    assert texts == [words(5, "a"), "a4\n\n" + words(9, "b")]


def test_long_paragraphs_split_at_sentences_then_words() -> None:
    text = "One two three. Four five six seven eight nine ten eleven twelve. End."
    texts = section_to_texts(Section((), text), max_words=5, overlap_words=0)
    assert texts == ["One two three.", "Four five six seven eight", "nine ten eleven twelve. End."]


# --- structure: lists, tables and quotes keep their Markdown ----------------------------------


def test_a_chunk_keeps_line_breaks_blank_lines_and_indentation() -> None:
    text = (
        "Intro   paragraph\there.\n\n- item one\n- item two\n  - nested item\n\n"
        "| name | role |\n|---|---|\n| Ana | CEO |\n\n> a quoted line\n> and another\r\n"
    )
    [chunk] = section_to_texts(Section(("H",), text), max_words=180, overlap_words=30)
    assert chunk == (
        "Intro paragraph here.\n\n- item one\n- item two\n  - nested item\n\n"
        "| name | role |\n|---|---|\n| Ana | CEO |\n\n> a quoted line\n> and another"
    )


def test_a_long_list_is_cut_between_items_with_overlap_and_cap() -> None:
    items = [f"- item {i} has four words" for i in range(30)]
    text = "A list follows:\n" + "\n".join(items)
    texts = section_to_texts(Section((), text), max_words=24, overlap_words=6)
    assert len(texts) > 4
    assert all(len(t.split()) <= 24 for t in texts)
    for previous, chunk in itertools.pairwise(texts):
        assert chunk.split()[:6] == previous.split()[-6:]  # the overlap words, as before
        # after its overlap, a chunk holds whole items, each on its own line
        fresh_lines = chunk.split("\n")[1:]
        assert fresh_lines and all(line in items for line in fresh_lines), chunk
    assert texts[0].startswith("A list follows:\n- item 0 has four words\n- item 1")
    assert join_chunks(texts) == text


def test_a_long_prose_paragraph_still_splits_at_sentences() -> None:
    text = "One two three.\nFour five six seven eight\nnine ten eleven twelve. End."
    texts = section_to_texts(Section((), text), max_words=5, overlap_words=0)
    # a hard-wrapped line is not a list: cuts fall at sentence ends, line breaks stay put
    assert texts == ["One two three.", "Four five six seven eight", "nine ten eleven twelve. End."]
    texts = section_to_texts(Section((), text), max_words=9, overlap_words=0)
    assert texts == ["One two three.", "Four five six seven eight\nnine ten eleven twelve.", "End."]


def test_table_parts_keep_one_row_per_line_and_rebuild_the_table() -> None:
    rows = [f"| person {i} | role {i} | mail{i}@x.example |" for i in range(20)]
    table = "| name | role | email |\n|---|---|---|\n" + "\n".join(rows)
    text = "Some prose before it.\n\n" + table
    texts = section_to_texts(Section(("contacts",), text), max_words=40, overlap_words=10)
    assert len(texts) > 3
    for part in texts[1:]:
        lines = part.split("\n")
        assert lines[:2] == ["| name | role | email |", "|---|---|---|"]
        assert all(line in rows for line in lines[2:])
    assert join_chunks(texts) == text  # the repeated header is dropped when rebuilding


def test_a_table_row_longer_than_a_chunk_continues_on_its_own_line() -> None:
    long_row = "| " + " ".join(f"w{i}" for i in range(30)) + " |"
    table = "| a | b |\n|---|---|\n| x | y |\n" + long_row
    texts = section_to_texts(Section((), table), max_words=20, overlap_words=5)
    assert all(len(t.split()) <= 20 for t in texts)
    assert all(t.startswith("| a | b |\n|---|---|\n") for t in texts)
    assert all(len(t.split("\n")) >= 3 for t in texts)  # the cut row never sits on the rule


def test_join_chunks_rebuilds_chunks_of_old_single_line_texts_as_before() -> None:
    assert join_chunks(["a b c d", "c d e f"]) == "a b c d e f"
    assert join_chunks(["Ends here.", "Next part"]) == "Ends here.\n\nNext part"
    assert join_chunks(["cut in the", "middle of a sentence"]) == (
        "cut in the middle of a sentence"
    )


@pytest.mark.parametrize(
    ("max_words", "overlap"), [(0, 0), (-5, 0), (10, -1), (10, 10), (10, 11), (1, 1)]
)
def test_bad_settings_raise_config_error(max_words: int, overlap: int) -> None:
    with pytest.raises(ConfigError) as err:
        document_to_chunks("d", doc(Section((), "a b c")), max_words=max_words,
                           overlap_words=overlap)  # fmt: skip
    assert str(max_words if max_words <= 0 else overlap) in str(err.value)


# --- properties ------------------------------------------------------------------------------


@st.composite
def sections_of_unique_words(draw: st.DrawFn) -> tuple[str, list[list[str]]]:
    """Section text whose words are all distinct, and its paragraphs' word lists."""
    counter = iter(range(10**6))
    paragraphs: list[list[str]] = []
    para_texts: list[str] = []
    for _ in range(draw(st.integers(0, 6))):
        sentences: list[str] = []
        para_words: list[str] = []
        for _ in range(draw(st.integers(1, 5))):
            n = draw(st.integers(1, 30))
            ws = [f"w{next(counter)}" for _ in range(n)]
            ws[-1] += draw(st.sampled_from([".", "!", "?", "", ","]))
            para_words.extend(ws)
            sentences.append(draw(st.sampled_from([" ", "  ", "\t", "\n"])).join(ws))
        paragraphs.append(para_words)
        para_texts.append(" ".join(sentences))
    separators = [
        draw(st.sampled_from(["\n\n", "\n \n", "\n\t\n\n", "\r\n\r\n"])) for _ in para_texts
    ]
    text = "".join(p + sep for p, sep in zip(para_texts, separators, strict=True))
    return draw(st.sampled_from(["", "  ", "\n\n"])) + text, paragraphs


caps = st.integers(1, 40).flatmap(lambda m: st.tuples(st.just(m), st.integers(0, m - 1)))


@PROPERTY
@given(section=sections_of_unique_words(), cap=caps)
def test_chunks_cover_the_section_exactly_with_bounded_overlap(
    section: tuple[str, list[list[str]]], cap: tuple[int, int]
) -> None:
    text, paragraphs = section
    max_words, overlap = cap
    all_words = text.split()
    position = {w: i for i, w in enumerate(all_words)}
    assert len(position) == len(all_words)  # the generator's promise: every word is distinct

    texts = section_to_texts(Section((), text), max_words=max_words, overlap_words=overlap)
    chunks = [t.split() for t in texts]
    if not all_words:
        assert chunks == []
        return
    assert all(1 <= len(c) <= max_words for c in chunks)

    # Each chunk is a contiguous run of the section's words.
    spans = []
    for c in chunks:
        start = position[c[0]]
        assert c == all_words[start : start + len(c)]
        spans.append((start, start + len(c)))

    assert spans[0][0] == 0
    assert spans[-1][1] == len(all_words)
    rebuilt = list(chunks[0])
    for i in range(1, len(chunks)):
        prev, chunk = chunks[i - 1], chunks[i]
        (_, prev_end), (start, end) = spans[i - 1], spans[i]
        shared = prev_end - start
        assert 0 <= shared < len(chunk), "no gap, and every chunk adds a new word"
        assert end > prev_end
        wanted = min(overlap, len(prev))
        assert shared <= wanted
        if shared < wanted:  # the overlap was trimmed only to make a piece fit
            assert len(chunk) == max_words
        assert chunk[:shared] == prev[len(prev) - shared :]
        rebuilt.extend(chunk[shared:])
    assert rebuilt == all_words
    if all(prev_end - start > 0 for (_, prev_end), (start, _) in itertools.pairwise(spans)):
        # chunks that overlap rebuild the section's text, its line breaks and blank lines too
        assert join_chunks(texts) == _render(_tokens(text))

    # A paragraph that fits under the cap is never split between chunks.
    for para in paragraphs:
        if len(para) <= max_words:
            assert any(" ".join(para) in " ".join(c) for c in chunks), para


VOCABULARY = ("a", "b", "a.", "b!", "c?", "é", "日本")


@st.composite
def sections_of_repeated_words(draw: st.DrawFn) -> str:
    """Text from a tiny vocabulary (so words repeat) with arbitrary whitespace between them."""
    tokens = draw(st.lists(st.sampled_from(VOCABULARY), max_size=120))
    gaps = draw(
        st.lists(
            st.sampled_from([" ", "\n", "\n\n", " \n \n ", "\t", "\u00a0", "\u2003"]),
            min_size=len(tokens),
            max_size=len(tokens),
        )
    )
    return "".join(t + g for t, g in zip(tokens, gaps, strict=True))


def _decompositions(chunks: list[list[str]], target: list[str], overlap: int) -> bool:
    """Is there a choice of overlaps under which the fresh parts rebuild ``target``?"""
    frontier = {len(chunks[0])} if chunks and chunks[0] == target[: len(chunks[0])] else set()
    for prev, chunk in itertools.pairwise(chunks):
        nxt: set[int] = set()
        for pos in frontier:
            for shared in range(min(overlap, len(prev), len(chunk) - 1) + 1):
                fresh = chunk[shared:]
                if (
                    chunk[:shared] == target[pos - shared : pos]
                    and fresh == target[pos : pos + len(fresh)]
                ):
                    nxt.add(pos + len(fresh))
        frontier = nxt
    return len(target) in frontier


@PROPERTY
@given(text=sections_of_repeated_words(), cap=caps)
def test_chunks_cover_text_with_repeated_words(text: str, cap: tuple[int, int]) -> None:
    max_words, overlap = cap
    target = text.split()
    chunks = [t.split() for t in section_to_texts(Section((), text), max_words=max_words,
                                                  overlap_words=overlap)]  # fmt: skip
    assert all(1 <= len(c) <= max_words for c in chunks)
    if not target:
        assert chunks == []
    else:
        assert _decompositions(chunks, target, overlap)


@PROPERTY
@given(sections=st.lists(sections_of_repeated_words(), max_size=4), cap=caps)
def test_document_chunks_are_the_section_chunks_in_order(
    sections: list[str], cap: tuple[int, int]
) -> None:
    max_words, overlap = cap
    document = doc(*(Section((f"h{i}",), text) for i, text in enumerate(sections)))
    chunks = document_to_chunks("d", document, max_words=max_words, overlap_words=overlap)
    expected = [
        (section.heading_path, t)
        for section in document.sections
        for t in section_to_texts(section, max_words=max_words, overlap_words=overlap)
    ]
    assert [(c.heading_path, c.text) for c in chunks] == expected
    assert [c.chunk_id for c in chunks] == [f"d:{i}" for i in range(len(chunks))]


def test_a_long_table_repeats_its_header_in_every_part() -> None:
    rows = "\n".join(
        f"| person {i} | role {i} | mail{i}@x.example | +31 30 555 01{i:02d} |" for i in range(40)
    )
    table = "| name | role | email | phone |\n|---|---|---|---|\n" + rows
    texts = section_to_texts(Section(("contacts",), table), max_words=80, overlap_words=10)
    assert len(texts) > 3 and all(len(t.split()) <= 80 for t in texts)
    head = "| name | role | email | phone |\n|---|---|---|---|\n| person "
    assert all(t.startswith(head) for t in texts)
    # Every row is in exactly one part, whole (no overlap words carried between parts).
    for i in range(40):
        row = f"| person {i} | role {i} | mail{i}@x.example | +31 30 555 01{i:02d} |"
        assert sum(row in t for t in texts) == 1, row


def test_text_that_only_looks_like_a_table_is_split_as_prose() -> None:
    from tasks.text.chunk import _render, _table_parts, _tokens

    assert _table_parts(_tokens(" ".join(["| not a table row"] * 40)), 50) is None  # no rule
    assert _table_parts(_tokens("| a |\n| b |\n| c |"), 50) is None  # no separator row
    parts = _table_parts(_tokens("| a |\n|---|\n| c |"), 50)
    assert parts is not None
    assert [_render(p) for p in parts] == ["| a |\n|---|\n| c |"]

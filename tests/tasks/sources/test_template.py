"""Tests for record templates (tasks.sources.template) rendered by Jinja2's sandbox: the
``{field}`` syntax of stored configs keeps its meaning exactly, nothing in a template's text runs
as Jinja, and a template cannot reach past a record's keys."""

from __future__ import annotations

import pytest
from jinja2 import Undefined
from jinja2.sandbox import SandboxedEnvironment

from core.errors import ConfigError
from tasks.sources import template as tpl
from tasks.sources.base import Limits
from tasks.sources.template import check_template, record_item, render


def test_templates_are_rendered_by_the_jinja2_sandbox() -> None:
    assert isinstance(tpl._ENV, SandboxedEnvironment)
    assert tpl._ENV.autoescape is False  # Markdown: "<" and "&" stay as they are
    assert render("{a} & {b}", {"a": "<b>x</b>", "b": "R&D"}) == "<b>x</b> & R&D"


def test_the_text_is_kept_byte_for_byte() -> None:
    template = "# {title}\r\n\r\n{body}\n\n"  # CRLF, and trailing newlines Jinja would trim
    assert render(template, {"title": "T", "body": "B"}) == "# T\r\n\r\nB\n\n"
    assert render("", {"x": 1}) == ""
    assert render("no fields at all", {}) == "no fields at all"


@pytest.mark.parametrize(
    ("template", "out"),
    [
        ("{{ 7*7 }}", "{ 7*7 }"),  # literal braces, as documented: never an expression
        ("{{% raw %}}{{# c #}}", "{% raw %}{# c #}"),
        ("{{{{ x }}}} {x}", "{{ x }} 1"),
        ("{% endraw %}# c #}", None),
    ],
)
def test_nothing_in_the_text_runs_as_jinja(template: str, out: str | None) -> None:
    if out is None:
        with pytest.raises(ConfigError, match="not a field reference"):
            render(template, {"x": 1})
    else:
        assert render(template, {"x": 1}) == out


@pytest.mark.parametrize(
    "template",
    [
        "{% for k in x %}{k}{% endfor %}",
        "{% if x %}yes{% endif %}",
        "{x|upper}",
        "{x()}",
        "{x['a']}",
        "{x + 1}",
    ],
)
def test_jinja_statements_and_expressions_are_not_fields(template: str) -> None:
    with pytest.raises(ConfigError, match=r"not a field reference|unbalanced"):
        check_template(template)


@pytest.mark.parametrize(
    "template",
    ["{x.__class__}", "{__class__}", "{x.__globals__.os}", "{x.y.__init__}", "{x.__dict__}"],
)
def test_a_python_internal_is_refused_when_the_template_is_checked(template: str) -> None:
    with pytest.raises(ConfigError, match="a Python internal, not a field of the record"):
        check_template(template)


def test_the_sandbox_looks_up_keys_only() -> None:
    # What a template's field becomes: a key of a record, never an attribute, never an internal
    # (even one a record holds as a key).
    env = tpl._ENV
    assert env.getitem({"a": 1}, "a") == 1
    assert isinstance(env.getitem({"__class__": "x"}, "__class__"), Undefined)
    assert isinstance(env.getattr("text", "upper"), Undefined)
    assert isinstance(env.getitem(["a"], 0), Undefined)


def test_a_field_is_a_key_never_an_attribute_or_a_method() -> None:
    record = {"meta": {"items": "the items field", "keys": 2}, "name": "Ada", "_id": "a1", "__v": 3}
    out = render("{meta.items} / {meta.keys} / {_id} / {__v}", record)
    assert out == "the items field / 2 / a1 / 3"  # "__v": a key Mongoose adds, not an internal
    # A dict's methods and a string's are not fields: the message says why, as before.
    with pytest.raises(ConfigError, match=r"'meta.values' is missing: 'meta' has the fields items"):
        render("{meta.values}", record)
    with pytest.raises(ConfigError, match="'name' is str, not a nested record"):
        render("{name.upper}", record)


def test_a_missing_field_fails_that_record_only() -> None:
    config = {"template": "# {title}\n\n{body.text}\n"}
    fields = {"uri": "sql://t/1", "name": "1.md", "version": None, "prior": None}
    good = record_item({"title": "A", "body": {"text": "B"}}, key="row/1", config=config,
                       fallback_title="", limits=Limits(), **fields)  # fmt: skip
    bad = record_item({"title": "A", "body": "no text"}, key="row/2", config=config,
                      fallback_title="", limits=Limits(), **fields)  # fmt: skip
    assert good.data == b"# A\n\nB\n" and good.error is None
    assert bad.data is None
    assert bad.error == (
        "row/2: field 'body.text': 'body' is str, not a nested record, so it has no fields"
    )


def test_values_are_written_as_before() -> None:
    record = {"n": None, "tags": ["a", 2, None], "meta": {"é": 1}, "raw": b"caf\xc3\xa9",
              "blob": b"\xff\xfe", "num": 1.5, "flag": True}  # fmt: skip
    out = render("[{n}] [{tags}] [{meta}] [{raw}] [{blob}] [{num}] [{flag}]", record)
    assert out == '[] [a, 2, ] [{"é": 1}] [café] [(2 bytes of binary data)] [1.5] [True]'

"""Markdown templates for record sources (`sql`, `rest`): one record becomes one document.

A template is Markdown with ``{field}`` where a record's value goes, ``{field.sub}`` for a
field of a nested record (a dotted path of keys, nothing else) and ``{{``/``}}`` for literal
braces: the syntax every stored config uses, kept as it is. It is translated into a Jinja2
template (the text as template data, each field as a lookup of its keys, so nothing in the text
is ever read as Jinja syntax) and rendered by a `SandboxedEnvironment` whose lookups read a
record's keys and nothing else: there is no attribute access, method, indexing, filter or format
spec, so ``{x.items}`` is the key ``items`` of the record ``x``, never a method. A field name
spelled like a Python internal (``{x.__class__}``, any ``__name__``) is refused when the
template is checked. Autoescaping is off (the output is Markdown), and a field the record
lacks fails the item (StrictUndefined), naming the field and the fields that are there.

Values: None becomes the empty string, a list its items joined with ``", "``, a nested record
its JSON, bytes their UTF-8 text (or a size when they are not text), anything else ``str()``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from jinja2 import StrictUndefined, Template, nodes
from jinja2.exceptions import TemplateError, UndefinedError
from jinja2.sandbox import SandboxedEnvironment

from core.errors import ConfigError
from tasks.sources.base import Item, Limits, Prior, too_big

_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
_SEGMENT = r"\w[\w\-]*"
_FIELD = re.compile(rf"{_SEGMENT}(?:\.{_SEGMENT})*")
_MAX_LISTED = 40

# A parsed template: literal text (str) and field paths (tuple of keys), in order.
_Part = str | tuple[str, ...]


class _RecordEnvironment(SandboxedEnvironment):
    """A sandbox whose every lookup (``a.b``, ``a["b"]``) is a key of a record: a value that is
    not a record, or lacks the key, gives an undefined value (an error when rendered)."""

    def getitem(self, obj: Any, argument: Any) -> Any:
        if (
            isinstance(obj, Mapping)
            and isinstance(argument, str)
            and not _internal(argument)
            and argument in obj
        ):
            return obj[argument]
        return self.undefined(obj=obj, name=argument)

    def getattr(self, obj: Any, attribute: str) -> Any:
        return self.getitem(obj, attribute)


def _internal(key: str) -> bool:
    """Whether a name is spelled like a Python internal (``__class__``, ``__globals__``); a
    record's ``__v`` or ``_id`` is not."""
    return len(key) >= 4 and key.startswith("__") and key.endswith("__")


@lru_cache(maxsize=64)
def _parse(template: str) -> tuple[_Part, ...]:
    parts: list[_Part] = []
    literal: list[str] = []
    at = 0
    for match in _TOKEN.finditer(template):
        literal.append(template[at : match.start()])
        at = match.end()
        token = match.group(0)
        if token in ("{{", "}}"):
            literal.append(token[0])
            continue
        if token in ("{", "}"):
            raise ConfigError(
                f"template has an unbalanced {token!r} at character {match.start()}: "
                f"{_around(template, match.start())!r}; write {{{{ and }}}} for literal braces"
            )
        name = (match.group(1) or "").strip()
        if not _FIELD.fullmatch(name):
            raise ConfigError(
                f"template placeholder {token!r} is not a field reference: use {{field}} or "
                "{field.sub} (letters, digits, _ and -; no format specs, indexes or calls); "
                "write {{ and }} for literal braces"
            )
        internal = next((key for key in name.split(".") if _internal(key)), None)
        if internal is not None:
            raise ConfigError(
                f"template placeholder {token!r} names {internal!r}, a Python internal, not a "
                "field of the record: a template reads a record's fields and nothing else; "
                "name a field"
            )
        if literal:
            parts.append("".join(literal))
            literal = []
        parts.append(tuple(name.split(".")))
    literal.append(template[at:])
    if any(literal):
        parts.append("".join(literal))
    return tuple(parts)


def _around(text: str, at: int) -> str:
    return text[max(0, at - 20) : at + 20]


def check_template(template: str) -> list[str]:
    """The field references of ``template`` (``"a"``, ``"a.b"``), in order, without repeats.

    Raises:
        ConfigError: An unbalanced brace, a placeholder that is not a field reference, or a
            field that names a Python internal (``__class__``).
    """
    if not isinstance(template, str):
        raise ConfigError(f"template must be a string, not {type(template).__name__}")
    _compiled(template)
    names: list[str] = []
    for part in _parse(template):
        if isinstance(part, tuple):
            name = ".".join(part)
            if name not in names:
                names.append(name)
    return names


def lookup(row: Mapping[str, Any], path: str | tuple[str, ...]) -> Any:
    """The value at the dotted ``path`` of ``row`` (dictionary keys only).

    Raises:
        ConfigError: A key is missing, or a value on the way is not a record; the message names
            the field and the fields that are there.
    """
    keys = tuple(path.split(".")) if isinstance(path, str) else path
    value: Any = row
    for depth, key in enumerate(keys):
        where = ".".join(keys[:depth])
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"field {'.'.join(keys)!r}: {where!r} is {type(value).__name__}, not a nested "
                "record, so it has no fields"
            )
        if key not in value:
            scope = f"{where!r} has" if where else "the record has"
            raise ConfigError(f"field {'.'.join(keys)!r} is missing: {scope} {_fields(value)}")
        value = value[key]
    return value


def _fields(record: Mapping[str, Any]) -> str:
    names = [str(name) for name in record]
    if not names:
        return "no fields"
    shown = ", ".join(names[:_MAX_LISTED])
    more = f" and {len(names) - _MAX_LISTED} more" if len(names) > _MAX_LISTED else ""
    return f"the fields {shown}{more}"


def text(value: Any) -> str:
    """A record value as template text."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple):
        return ", ".join(text(item) for item in value)
    if isinstance(value, Mapping):
        return json.dumps(value, ensure_ascii=False, default=str)
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return f"({len(raw):,} bytes of binary data)"
    return str(value)


_ENV = _RecordEnvironment(autoescape=False, undefined=StrictUndefined, finalize=text)
"""Markdown, not HTML: nothing is escaped. Every value is written as `text` writes it."""


@lru_cache(maxsize=64)
def _compiled(template: str) -> Template:
    """``template`` as a Jinja2 template, built as its syntax tree (not as Jinja source, so no
    text of it is ever read as Jinja): the literal text as template data, each field a chain of
    key lookups on ``record``."""
    body: list[nodes.Expr] = []
    for part in _parse(template):
        if isinstance(part, str):
            body.append(nodes.TemplateData(part))
            continue
        value: nodes.Expr = nodes.Name("record", "load")
        for key in part:
            value = nodes.Getitem(value, nodes.Const(key), "load")
        body.append(value)
    tree = nodes.Template([nodes.Output(body)])
    tree.set_environment(_ENV)
    tree.set_lineno(1, override=True)
    return _ENV.from_string(tree)


def render(template: str, row: Mapping[str, Any]) -> str:
    """``template`` with each ``{field}`` replaced by ``row``'s value.

    Raises:
        ConfigError: The template is malformed, or names a field the row lacks (the message
            names it and the row's fields).
    """
    try:
        return _compiled(template).render(record=row)
    except UndefinedError:
        pass  # a field the row lacks: `lookup` names it below, outside this handler
    except TemplateError as exc:
        raise ConfigError(f"template could not be rendered: {exc}") from None
    for name in check_template(template):
        lookup(row, name)
    raise ConfigError(f"a template field is missing: the record has {_fields(row)}")


def _flatten(row: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    pairs: list[tuple[str, Any]] = []
    for name, value in row.items():
        label = f"{prefix}{name}"
        if isinstance(value, Mapping) and value:
            pairs.extend(_flatten(value, f"{label}."))
        else:
            pairs.append((label, value))
    return pairs


def default_markdown(
    row: Mapping[str, Any], title_field: str | None, *, fallback_title: str = ""
) -> str:
    """The document of a record when its source has no template.

    A ``# title`` heading (the ``title_field`` value, else ``fallback_title``), then every
    field: one-line values as a ``- **field:** value`` list (nested records flattened to dotted
    names), values of several lines (a Markdown body, a table) each under a ``## field``
    heading, verbatim.
    """
    title = ""
    if title_field:
        try:
            title = text(lookup(row, title_field))
        except ConfigError:
            title = ""
    title = " ".join(title.split()) or " ".join(fallback_title.split()) or "Untitled"
    short: list[str] = []
    long: list[str] = []
    for name, value in _flatten(row):
        if title_field and name == title_field:
            continue
        body = text(value).strip()
        if "\n" in body:
            long.append(f"## {name}\n\n{body}\n")
        else:
            short.append(f"- **{name}:** {body}")
    lines = [f"# {title}", ""]
    if short:
        lines += [*short, ""]
    lines += long
    return "\n".join(lines).rstrip("\n") + "\n"


def record_item(
    record: Mapping[str, Any],
    *,
    key: str,
    uri: str,
    name: str,
    version: str | None,
    prior: Prior | None,
    config: Mapping[str, Any],
    fallback_title: str,
    limits: Limits,
) -> Item:
    """One row or record as an item: unchanged when its ``version`` is the one last synced,
    else rendered by the config's ``template`` (or `default_markdown` under its ``title``
    field); a render that fails or a document over ``max_item_bytes`` is a failed item."""
    if version is not None and prior is not None and prior.version == version:
        return Item(key, uri, name, version=version, unchanged=True)
    template = config.get("template")
    try:
        if template:
            doc = render(template, record)
        else:
            doc = default_markdown(record, config.get("title"), fallback_title=fallback_title)
    except ConfigError as exc:
        return Item(key, uri, name, version=version, error=f"{key}: {exc}")
    data = doc.encode("utf-8")
    if len(data) > limits.max_item_bytes:
        return Item(key, uri, name, version=version, error=too_big(key, len(data), limits))
    return Item(key, uri, name, version=version, data=data)

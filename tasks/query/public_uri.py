"""What an agent is told about where a source lives: a stable name, never a server path.

A document ingested from a file keeps its ``file://`` URI in the registry (it is how kbflow finds
the source again), but a path on the server says how the server is laid out (its home, its
upload folders) to every agent that searches. Agents get ``kbflow://<org>/<key>/<file name>``
instead: the file's name, which a person recognises, under a key derived from the full URI, so
two files of one name in different folders stay apart and every version of one source keeps
its URI. Web pages and other URIs are public already and pass unchanged.

`publish_uris` rewrites every ``file://`` URI in a result (keys, values, and text such as an
answer's "Sources" lines) for the org the caller acts in.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any
from urllib.parse import quote, unquote, urlsplit

SCHEME = "kbflow"
_FILE_URI = re.compile(r"file:/[^\s\"'<>()\[\]]+")


def public_uri(uri: str, org_id: str) -> str:
    """``uri`` as an agent may see it: a ``file:`` URI becomes ``kbflow://<org>/<key>/<name>``
    (its fragment kept: a row of a table file), anything else is returned as it is.

    Example:
        >>> public_uri("file:///srv/kb/uploads/3f2a/Price%20list.pdf", "acme")
        'kbflow://acme/1d20bf9903cb/Price%20list.pdf'
    """
    if not uri.startswith("file:"):
        return uri
    parts = urlsplit(uri)
    name = unquote(parts.path.rstrip("/").rsplit("/", 1)[-1]) or "source"
    key = hashlib.sha256(parts._replace(fragment="").geturl().encode("utf-8")).hexdigest()[:12]
    out = f"{SCHEME}://{quote(org_id, safe='')}/{key}/{quote(name)}"
    return f"{out}#{parts.fragment}" if parts.fragment else out


def publish_uris(value: Any, org_id: str) -> Any:
    """``value`` (JSON-like: dicts, lists, strings) with every ``file:`` URI in it made public
    (`public_uri`); a new object, the input is left as it was."""
    if isinstance(value, str):
        if "file:/" not in value:
            return value
        return _FILE_URI.sub(lambda m: public_uri(m.group(0), org_id), value)
    if isinstance(value, dict):
        return {key: publish_uris(item, org_id) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [publish_uris(item, org_id) for item in value]
    return value

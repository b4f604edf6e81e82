"""Speech-to-text accuracy, confidence and speed: faster-whisper (Whisper base, int8) against
pocketsphinx.

Speaks 24 English sentences with espeak-ng in four voices and three speeds, transcribes each
with both engines, and reports the word error rate (WER: word edit distance over reference
words, `tasks.ingest.speech_fw.word_error_rate`), the transcript confidence
(`tasks.ingest.media.transcript_confidence`) and the real-time factor (transcription seconds
per audio second, on this machine). Then: noise clips (white noise at three levels, which should
get low confidence), and the real-docs recordings (``sample_10s.mp3``; any ``*.flac`` with a
``<name>.txt`` or ``groundtruth/<name>.flac.md`` reference is scored too). Prints a table and
saves bench/results/speech_wer.json.

Run: ``.venv/bin/python bench/speech_wer.py``. Needs espeak-ng and ffmpeg on PATH.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DATASETS = Path(os.environ.get("KBFLOW_DATASETS", REPO.parent / "shared" / "datasets"))

SENTENCES = [
    "The quarterly report shows revenue grew by twelve percent in the northern region.",
    "Please send the signed contract to the legal team before the end of the week.",
    "Our support desk is open from nine in the morning until six in the evening.",
    "The new warehouse will double our storage capacity by next spring.",
    "Customers can reset their password from the account settings page.",
    "The board approved the budget for the marketing campaign last Tuesday.",
    "All invoices must include the purchase order number and the delivery date.",
    "The training session covers safety rules for working with heavy machinery.",
    "We moved the meeting to the small conference room on the third floor.",
    "The software update fixes a bug that caused the application to crash.",
    "Employees should book their holidays at least two weeks in advance.",
    "The delivery truck arrives every Monday and Thursday around noon.",
    "Our refund policy allows returns within thirty days of purchase.",
    "The engineering team is hiring two developers and one designer.",
    "Please keep the fire doors closed at all times.",
    "The price of coffee beans rose sharply after the poor harvest.",
    "The library lends books, films and music to every resident of the town.",
    "A short walk from the station brings you to the museum entrance.",
    "The committee will publish its findings in a report next month.",
    "Water the plants twice a week and keep them out of direct sunlight.",
    "The hotel offers free breakfast to guests who stay more than two nights.",
    "Backups run every night at two o'clock and are kept for ninety days.",
    "The children played football in the park until it started to rain.",
    "Remember to lock the office and switch off the lights when you leave.",
]
# (voice, words per minute): each sentence is spoken by one of these, in turn.
VOICES = [
    ("en-us", 160),
    ("en-gb", 175),
    ("en-gb-scotland", 140),
    ("en-us", 200),
    ("en-gb-x-rp", 130),
    ("en-029", 165),
]
NOISE_LEVELS = (0.02, 0.1, 0.3)  # white noise standard deviation (full scale 1.0)


def main() -> int:
    from tasks.ingest.media import (
        SAMPLE_RATE,
        PocketsphinxTranscriber,
        Transcriber,
        decode_audio,
        transcript_confidence,
    )
    from tasks.ingest.speech_fw import (
        MODEL_DIRNAME,
        FasterWhisperTranscriber,
        assemble_model,
        synthesize,
        word_error_rate,
    )

    with tempfile.TemporaryDirectory(prefix="kbflow-bench-") as tmp:
        started = time.perf_counter()
        folder = assemble_model(Path(tmp) / MODEL_DIRNAME)
        assemble_s = time.perf_counter() - started
        started = time.perf_counter()
        engines: dict[str, Transcriber] = {
            "faster-whisper": FasterWhisperTranscriber(folder),
            "pocketsphinx": PocketsphinxTranscriber(),
        }
        load_s = time.perf_counter() - started

        def run(engine: Transcriber, audio: np.ndarray) -> dict[str, Any]:
            t0 = time.perf_counter()
            segments = engine.transcribe(audio, language="en")
            seconds = time.perf_counter() - t0
            return {
                "text": " ".join(s.text for s in segments),
                "confidence": transcript_confidence([s for s in segments if s.text.strip()]),
                "seconds": round(seconds, 3),
                "rtf": round(seconds / (len(audio) / SAMPLE_RATE), 4),
            }

        rows: list[dict[str, Any]] = []
        for i, sentence in enumerate(SENTENCES):
            voice, speed = VOICES[i % len(VOICES)]
            audio = synthesize(sentence, voice=voice, speed=speed)
            row: dict[str, Any] = {"voice": voice, "speed": speed, "reference": sentence}
            row["audio_s"] = round(len(audio) / SAMPLE_RATE, 2)
            for name, engine in engines.items():
                out = run(engine, audio)
                out["wer"] = round(word_error_rate(sentence, out["text"]), 4)
                row[name] = out
            rows.append(row)
            print(
                f"{voice:15} {speed:3} fw WER {row['faster-whisper']['wer']:.2f} "
                f"conf {row['faster-whisper']['confidence']}  ps WER "
                f"{row['pocketsphinx']['wer']:.2f}",
                flush=True,
            )

        rng = np.random.default_rng(7)
        noise = []
        for level in NOISE_LEVELS:
            audio = (rng.standard_normal(SAMPLE_RATE * 5) * level).clip(-1, 1).astype(np.float32)
            out = run(engines["faster-whisper"], audio)
            noise.append({"std": level, "seconds_audio": 5, **out})
            print(f"noise {level}: conf {out['confidence']} text {out['text'][:60]!r}")

        real: list[dict[str, Any]] = []
        sources = DATASETS / "real-docs" / "sources"
        for path in sorted(sources.glob("*.mp3")) + sorted(DATASETS.rglob("*.flac")):
            audio = decode_audio(path, max_duration_s=3600.0, timeout_s=300.0)
            reference = _reference(path)
            entry: dict[str, Any] = {"file": path.name, "audio_s": round(len(audio) / 16000, 2)}
            for name, engine in engines.items():
                out = run(engine, audio)
                if reference is not None:
                    out["wer"] = round(word_error_rate(reference, out["text"]), 4)
                entry[name] = out
            entry["has_reference"] = reference is not None
            real.append(entry)
            print(f"{path.name}: {entry}")

    summary = {}
    for name in engines:
        wers = [r[name]["wer"] for r in rows]
        refs = [len(r["reference"].split()) for r in rows]
        summary[name] = {
            "wer_mean": round(statistics.fmean(wers), 4),
            "wer_pooled": round(sum(w * n for w, n in zip(wers, refs, strict=True)) / sum(refs), 4),
            "wer_max": max(wers),
            "rtf_median": round(statistics.median(r[name]["rtf"] for r in rows), 4),
            "confidence_min": min((r[name]["confidence"] or 0.0) for r in rows),
            "confidence_median": statistics.median((r[name]["confidence"] or 0.0) for r in rows),
        }
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "sentences": len(rows),
        "assemble_s": round(assemble_s, 2),
        "load_s": round(load_s, 2),
        "summary": summary,
        "noise": noise,
        "real_docs": real,
        "flac_found": any(e["file"].endswith(".flac") for e in real),
        "rows": rows,
    }
    out_path = REPO / "bench" / "results" / "speech_wer.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    print(f"saved {out_path.relative_to(REPO)}")
    return 0


def _reference(path: Path) -> str | None:
    """A recording's reference transcript: ``<name>.txt`` beside it, or the real-docs
    groundtruth ``<name>.<ext>.md`` / ``<name>.md``; None when there is none."""
    candidates = [path.with_suffix(".txt"), path.with_name(path.name + ".txt")]
    groundtruth = path.parent.parent / "groundtruth"
    candidates += [groundtruth / f"{path.name}.md", groundtruth / f"{path.stem}.md"]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.read_text(encoding="utf-8", errors="replace")
    return None


if __name__ == "__main__":
    raise SystemExit(main())

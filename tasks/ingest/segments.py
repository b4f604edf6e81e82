"""What a speech engine hands back, shared by every transcriber (`tasks.ingest.media` for
openai-whisper and pocketsphinx, `tasks.ingest.speech_fw` for faster-whisper): a timed
`Segment` with its confidence, and Whisper's input sample rate."""

from __future__ import annotations

import math
from dataclasses import dataclass

SAMPLE_RATE = 16_000
"""Samples per second of the mono audio every engine is given (Whisper's own rate)."""


@dataclass(frozen=True)
class Segment:
    """A stretch of recognised speech and when it was said, in seconds from the start.

    ``confidence`` is the engine's own, in [0, 1] (Whisper: mean token probability times the
    probability that the stretch holds speech); None when the engine gives none (pocketsphinx).
    """

    start_s: float
    end_s: float
    text: str
    confidence: float | None = None


def segment_confidence(avg_logprob: float, no_speech_prob: float) -> float:
    """A Whisper segment's confidence in [0, 1]: its mean token probability
    (``exp(avg_logprob)``) times the probability that it holds speech (``1 - no_speech_prob``).
    """
    value = math.exp(min(avg_logprob, 0.0)) * (1.0 - no_speech_prob)
    return round(min(max(value, 0.0), 1.0), 4)

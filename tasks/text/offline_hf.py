"""Hugging Face libraries, set up for this platform: local files only, and quiet."""

from __future__ import annotations

import os


def quiet_offline_hf() -> None:
    """Before a transformers or sentence-transformers model loads: never reach a model hub,
    no tokenizer thread pools behind our own, no progress bars on a person's terminal."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

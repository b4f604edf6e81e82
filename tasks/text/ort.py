"""ONNX Runtime, imported the one way kbflow imports it: with its telemetry off."""

from __future__ import annotations

import os
from typing import Any


def onnxruntime_without_telemetry() -> Any:
    """The ``onnxruntime`` module with its telemetry off. ONNX Runtime 1.32 sends events to a
    Microsoft endpoint from a thread of its own some seconds after a session opens, on Linux
    too (seen in an empty network namespace, issue 41 #19); ``disable_telemetry_events()`` does
    not stop it, the ``ORT_DISABLE_TELEMETRY`` variable does (`core.settings` sets it for every
    kbflow process; this covers code that runs without that, e.g. on a Prefect worker)."""
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    import onnxruntime

    return onnxruntime

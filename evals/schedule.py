"""When the nightly eval runs: the one definition of its deployment name, cron and time zone.

`evals.nightly` builds its deployment from these, `kbflow serve-schedules` offers them as its
defaults, and a test checks that ``prefect.yaml``'s ``nightly-eval`` schedule says the same.
They live apart from the flow because the CLI reads them when it is imported, and importing the
CLI must not import Prefect (`tests/test_layers.py`).
"""

from __future__ import annotations

NIGHTLY_DEPLOYMENT = "nightly-eval"
NIGHTLY_CRON = "0 2 * * *"
NIGHTLY_TIMEZONE = "Europe/London"

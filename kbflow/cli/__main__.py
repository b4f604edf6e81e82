"""``python -m kbflow.cli``: the same program as the ``kbflow`` console script."""

from kbflow.cli import app

app()

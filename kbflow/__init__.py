"""kbflow: a knowledge-base platform for AI agents, orchestrated with Prefect."""

__version__ = "0.1.0"

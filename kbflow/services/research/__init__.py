"""Research: an account manager's seed bundle and the run that drafts four KB documents.

Owns seeding and who may run research, with no Prefect (`seeds`, for ``kbflow serve``), and
the research run itself (`runs`); the JSON they return, as typed dicts (`types`).
"""

from core.lazy import public_names

_PUBLIC = {  # what other domains may import from here, and the module that holds it
    "run_research": "runs",
}
__all__ = sorted(_PUBLIC)
__getattr__ = public_names(__name__, _PUBLIC)

"""Sources: the sources an org syncs (`kbflow sources`, the source routes).

Owns adding, listing, showing, updating and removing a source and starting its sync job
(`definitions`), and the sync itself and its schedules, which run Prefect (`sync`).
"""

from core.lazy import public_names

_PUBLIC = {  # what other domains may import from here, and the module that holds it
    "SOURCE_SYNC_KIND": "definitions",
    "sync_source": "sync:sync",  # the module `sync` keeps its own name
}
__all__ = sorted(_PUBLIC)
__getattr__ = public_names(__name__, _PUBLIC)

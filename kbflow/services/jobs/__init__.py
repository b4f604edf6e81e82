"""Jobs: background work recorded in the registry and run by a process of its own.

Owns starting, admitting, reading and noticing dead jobs (`queue`), the upload folders that
end with them (`uploads`) and the JSON they return, as typed dicts (`types`). What a job runs
is `kbflow.services.job_runner`'s, the process entry point that stands above the domains whose
work it runs.
"""

from core.lazy import public_names

_PUBLIC = {  # what other domains may import from here, and the module that holds it
    "INGEST_KIND": "queue",
    "QUEUE_MARK": "queue",
    "RESEARCH_KIND": "queue",
    "prune_uploads": "uploads",
    "queue": "queue",
    "refresh": "queue",
    "remove_uploads": "uploads",
    "start_dispatcher": "queue",
    "start_job": "queue",
    "submit_ingest_job": "queue",
    "submit_research_job": "queue",
}
__all__ = sorted(_PUBLIC)
__getattr__ = public_names(__name__, _PUBLIC)

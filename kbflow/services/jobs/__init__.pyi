"""The names other domains import from this package, for the type checker: at run time
`__init__.py` imports each from its module on first use (its `_PUBLIC`, which
`tests/test_house.py` holds equal to this list)."""

from kbflow.services.jobs import queue as queue
from kbflow.services.jobs.queue import INGEST_KIND as INGEST_KIND
from kbflow.services.jobs.queue import QUEUE_MARK as QUEUE_MARK
from kbflow.services.jobs.queue import RESEARCH_KIND as RESEARCH_KIND
from kbflow.services.jobs.queue import refresh as refresh
from kbflow.services.jobs.queue import start_dispatcher as start_dispatcher
from kbflow.services.jobs.queue import start_job as start_job
from kbflow.services.jobs.queue import submit_ingest_job as submit_ingest_job
from kbflow.services.jobs.queue import submit_research_job as submit_research_job
from kbflow.services.jobs.uploads import prune_uploads as prune_uploads
from kbflow.services.jobs.uploads import remove_uploads as remove_uploads

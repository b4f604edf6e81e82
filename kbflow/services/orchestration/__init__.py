"""Orchestration: kbflow's Prefect plumbing, for every other domain.

Owns the Prefect servers kbflow starts (`processes`: recorded, stopped, orphans reaped),
whether a server is set and ``kbflow server`` (`server`), Prefect's REST API spoken without
importing Prefect (`prefect_api`), and the flow runs kbflow tracks (`flow_runs`). It imports
no other domain.
"""

from core.lazy import public_names

_PUBLIC = {  # what other domains may import from here, and the module that holds it
    "adopt_running_server": "server",
    "guard_process": "processes",
    "prefect_api": "prefect_api",
    "prefect_api_url": "server",
    "prefect_starting": "server",
    "require_prefect_server": "server",
    "running_server_url": "server",
    "tracked": "flow_runs",
}
__all__ = sorted(_PUBLIC)
__getattr__ = public_names(__name__, _PUBLIC)

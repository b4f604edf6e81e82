"""The names other domains import from this package, for the type checker: at run time
`__init__.py` imports each from its module on first use (its `_PUBLIC`, which
`tests/test_house.py` holds equal to this list)."""

from kbflow.services.orchestration import prefect_api as prefect_api
from kbflow.services.orchestration.flow_runs import tracked as tracked
from kbflow.services.orchestration.processes import guard_process as guard_process
from kbflow.services.orchestration.server import adopt_running_server as adopt_running_server
from kbflow.services.orchestration.server import prefect_api_url as prefect_api_url
from kbflow.services.orchestration.server import prefect_starting as prefect_starting
from kbflow.services.orchestration.server import require_prefect_server as require_prefect_server
from kbflow.services.orchestration.server import running_server_url as running_server_url

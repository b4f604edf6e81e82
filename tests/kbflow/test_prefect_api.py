"""kbflow's REST calls to a Prefect server ride out its "busy, try again" answers: a real HTTP
server on loopback answers 503 (as Prefect does while its database is locked) before it
answers, and the call still succeeds; past the attempts the error says what the server said."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from core.errors import JobRunnerUnavailable
from kbflow.services.orchestration import prefect_api


class Busy:
    """A server that answers ``busy`` times 503 (with Retry-After: 0), then 201."""

    def __init__(self, busy: int) -> None:
        self.busy = busy
        self.seen: list[str] = []


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, Busy]]:
    state = Busy(request.param)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            state.seen.append(body.get("idempotency_key", ""))
            if len(state.seen) <= state.busy:
                self._answer(503, {"exception_message": "Service Unavailable"}, retry="0")
            else:
                self._answer(201, {"id": "run-1"})

        def _answer(self, status: int, body: dict[str, Any], retry: str | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            if retry is not None:
                self.send_header("retry-after", retry)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/api", state
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize("server", [2], indirect=True)
def test_a_busy_server_is_asked_again_with_the_same_idempotency_key(
    server: tuple[str, Busy],
) -> None:
    url, state = server
    assert prefect_api.start_run(url, "dep-1", {"job_id": "j"}, key="job-7") == "run-1"
    assert state.seen == ["job-7"] * 3  # two 503s, then the run: one key, so one run


@pytest.mark.parametrize("server", [prefect_api.RETRY_ATTEMPTS], indirect=True)
def test_a_server_that_stays_busy_is_reported(server: tuple[str, Busy]) -> None:
    url, state = server
    with pytest.raises(JobRunnerUnavailable, match="HTTP 503"):
        prefect_api.start_run(url, "dep-1", {"job_id": "j"}, key="job-8")
    assert len(state.seen) == prefect_api.RETRY_ATTEMPTS

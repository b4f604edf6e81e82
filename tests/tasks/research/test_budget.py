"""The research budget: caps on fetches and tokens, and the Prometheus counter."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from core.errors import BudgetExceeded, ConfigError
from tasks.research.budget import ResearchBudget


def _exceeded(org: str) -> float:
    value = REGISTRY.get_sample_value("kb_research_budget_exceeded_total", {"org": org})
    return value or 0.0


def test_charges_up_to_the_caps_succeed() -> None:
    budget = ResearchBudget("acme-ok", max_fetches=2, max_tokens=100)
    budget.charge_fetch("https://a.example/")
    budget.charge_fetch("https://b.example/")
    budget.charge_tokens(60, "corpus")
    budget.charge_tokens(40, "reply")
    assert (budget.fetches, budget.tokens) == (2, 100)
    assert _exceeded("acme-ok") == 0


def test_crossing_the_fetch_cap_raises_and_counts() -> None:
    budget = ResearchBudget("acme-fetch", max_fetches=1, max_tokens=100)
    budget.charge_fetch("https://a.example/")
    before = _exceeded("acme-fetch")
    with pytest.raises(BudgetExceeded, match=r"fetch 2 of 1.*Nothing was persisted"):
        budget.charge_fetch("https://b.example/")
    assert _exceeded("acme-fetch") == before + 1
    assert budget.fetches == 1  # the refused fetch was not recorded


def test_crossing_the_token_cap_raises_and_counts() -> None:
    budget = ResearchBudget("acme-tokens", max_fetches=1, max_tokens=100)
    budget.charge_tokens(99, "corpus")
    with pytest.raises(BudgetExceeded, match="prompt needs 2 tokens; 99 of 100"):
        budget.charge_tokens(2, "prompt")
    assert _exceeded("acme-tokens") == 1
    assert budget.tokens == 99


def test_the_fetch_cap_says_it_stopped_the_run_and_names_its_setting() -> None:
    budget = ResearchBudget("acme-which-fetch", max_fetches=1, max_tokens=100)
    budget.charge_fetch("https://a.example/")
    with pytest.raises(BudgetExceeded) as err:
        budget.charge_fetch("https://b.example/")
    message = str(err.value)
    assert "the fetch cap stopped it" in message
    assert "KBFLOW_RESEARCH_MAX_FETCHES=1" in message and "default 30" in message
    assert "--budget" not in message  # the token budget is not what to raise
    assert budget.exceeded == "fetches"
    reason = budget.stop_reason()
    assert reason is not None and reason.startswith("stopped by the fetch cap: 1 of 1 fetches")
    assert "raise KBFLOW_RESEARCH_MAX_FETCHES (now 1, default 30)" in reason
    assert "--budget" not in reason


def test_the_token_budget_says_it_stopped_the_run_and_names_its_flag() -> None:
    budget = ResearchBudget("acme-which-tokens", max_fetches=5, max_tokens=100)
    assert budget.stop_reason() is None
    budget.charge_fetch("https://a.example/")
    with pytest.raises(BudgetExceeded) as err:
        budget.charge_tokens(101, "account-manager corpus")
    message = str(err.value)
    assert "the token budget stopped it" in message and "--budget, now 100" in message
    assert "KBFLOW_RESEARCH_MAX_FETCHES" not in message
    assert budget.exceeded == "tokens"
    reason = budget.stop_reason()
    assert reason is not None and reason.startswith("stopped by the token budget: 0 of 100")
    assert "raise --budget (now 100)" in reason
    assert "KBFLOW_RESEARCH_MAX_FETCHES" not in reason


def test_bad_budgets_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="budget_cap_tokens must be > 0"):
        ResearchBudget("x", max_tokens=0)
    with pytest.raises(ConfigError, match="negative"):
        ResearchBudget("x").charge_tokens(-1, "x")


def test_metrics_are_pushed_to_a_gateway() -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from tasks.research.budget import push_metrics

    received: list[tuple[str, str, bytes]] = []

    class Gateway(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.command, self.path, body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Gateway)
    thread = threading.Thread(target=server.handle_request, daemon=True)
    thread.start()
    with pytest.raises(BudgetExceeded):
        ResearchBudget("pushed", max_fetches=0).charge_fetch("https://a.example/")
    assert push_metrics(f"127.0.0.1:{server.server_port}", "pushed")
    thread.join(timeout=10)
    server.server_close()
    (method, path, body) = received[0]
    assert method == "PUT" and path == "/metrics/job/kbflow_research/org/pushed"
    assert b'kb_research_budget_exceeded_total{org="pushed"} 1.0' in body


def test_an_unreachable_gateway_is_logged_not_raised() -> None:
    from tasks.research.budget import push_metrics

    assert push_metrics("127.0.0.1:9", "nobody") is False

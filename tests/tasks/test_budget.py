"""The research budget: caps on fetches and tokens, and the Prometheus counter."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from kbflow.errors import BudgetExceeded, ConfigError
from tasks.budget import ResearchBudget


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


def test_bad_budgets_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="budget_cap_tokens must be > 0"):
        ResearchBudget("x", max_tokens=0)
    with pytest.raises(ConfigError, match="negative"):
        ResearchBudget("x").charge_tokens(-1, "x")

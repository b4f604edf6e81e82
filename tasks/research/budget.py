"""The research budget: a cap on outbound fetches and on tokens, charged as the run goes.

Crossing either cap raises :class:`~core.errors.BudgetExceeded`; the research flow then
persists nothing and counts the event in the Prometheus counter
``kb_research_budget_exceeded_total{org=...}``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from prometheus_client import REGISTRY, Counter, push_to_gateway

from core.errors import BudgetExceeded, ConfigError

log = logging.getLogger(__name__)

DEFAULT_MAX_FETCHES = 30
DEFAULT_MAX_TOKENS = 200_000
# What raises each cap: the fetch cap is a setting, the token budget a `kbflow research` flag
# (the flow's ``budget_cap_tokens``).
FETCH_CAP_SETTING = "KBFLOW_RESEARCH_MAX_FETCHES"
TOKEN_CAP_FLAG = "--budget"

BUDGET_EXCEEDED_TOTAL = Counter(
    "kb_research_budget_exceeded_total",
    "Research runs stopped because they crossed their fetch or token budget.",
    ["org"],
)


@dataclass
class ResearchBudget:
    """What one research run may spend; every charge is checked before it is recorded."""

    org_id: str
    max_fetches: int = DEFAULT_MAX_FETCHES
    max_tokens: int = DEFAULT_MAX_TOKENS
    fetches: int = 0
    tokens: int = 0
    charges: list[tuple[str, str, int]] = field(default_factory=list)  # (kind, what, amount)
    exceeded: str | None = None
    """The cap that stopped the run: ``"fetches"`` or ``"tokens"``; None while within both."""

    def __post_init__(self) -> None:
        if self.max_fetches < 0:
            raise ConfigError(f"max_fetches must be >= 0. Currently it is {self.max_fetches}.")
        if self.max_tokens <= 0:
            raise ConfigError(f"budget_cap_tokens must be > 0. Currently it is {self.max_tokens}.")

    def charge_fetch(self, what: str) -> None:
        """Count one outbound fetch (before it is made)."""
        if self.fetches + 1 > self.max_fetches:
            self._exceeded(
                "fetches",
                f"the fetch cap stopped it: fetch of {what} would be fetch {self.fetches + 1} "
                f"of {self.max_fetches} ({FETCH_CAP_SETTING}={self.max_fetches})",
            )
        self.fetches += 1
        self.charges.append(("fetch", what, 1))

    def charge_tokens(self, amount: int, what: str) -> None:
        """Count ``amount`` tokens for ``what`` (corpus, a public block, the prompt, the reply)."""
        if amount < 0:
            raise ConfigError(f"a token charge cannot be negative. Currently it is {amount}.")
        if self.tokens + amount > self.max_tokens:
            self._exceeded(
                "tokens",
                f"the token budget stopped it: {what} needs {amount} tokens; {self.tokens} of "
                f"{self.max_tokens} are spent",
            )
        self.tokens += amount
        self.charges.append(("tokens", what, amount))

    def stop_reason(self) -> str | None:
        """One line on which cap stopped the run and what raises it; None while within both."""
        if self.exceeded == "fetches":
            return (
                f"stopped by the fetch cap: {self.fetches} of {self.max_fetches} fetches made, "
                f"one more was needed ({self.tokens} tokens spent). Nothing was persisted; raise "
                f"{FETCH_CAP_SETTING} (now {self.max_fetches}, default {DEFAULT_MAX_FETCHES}) "
                "or set KBFLOW_RESEARCH_OFFLINE=true to skip public context."
            )
        if self.exceeded == "tokens":
            return (
                f"stopped by the token budget: {self.tokens} of {self.max_tokens} tokens spent "
                f"and the next step needed more. Nothing was persisted; raise {TOKEN_CAP_FLAG} "
                f"(now {self.max_tokens}) or seed fewer/smaller inputs."
            )
        return None

    def _exceeded(self, cap: str, detail: str) -> None:
        self.exceeded = cap
        BUDGET_EXCEEDED_TOTAL.labels(org=self.org_id).inc()
        log.warning("research budget exceeded for org %s: %s", self.org_id, detail)
        if cap == "fetches":
            advice = (
                f"raise {FETCH_CAP_SETTING} (now {self.max_fetches}, default "
                f"{DEFAULT_MAX_FETCHES}) or set KBFLOW_RESEARCH_OFFLINE=true to skip public "
                "context"
            )
        else:
            advice = (
                f"raise the token budget ({TOKEN_CAP_FLAG}, now {self.max_tokens}) or seed "
                "fewer/smaller inputs"
            )
        raise BudgetExceeded(
            f"research budget exceeded for org {self.org_id!r}: {detail}. Nothing was persisted; "
            f"{advice}, and run again."
        )


def push_metrics(gateway: str, org_id: str) -> bool:
    """Push this process's research metrics to a Prometheus Pushgateway (job ``kbflow_research``,
    grouped by org). Research runs are short-lived processes, so they push rather than wait to
    be scraped. Returns False (and logs) if the gateway cannot be reached."""
    try:
        push_to_gateway(
            gateway, job="kbflow_research", grouping_key={"org": org_id}, registry=REGISTRY
        )
    except OSError as exc:
        log.warning("could not push metrics to %s: %s", gateway, exc)
        return False
    return True

"""App services: what every entry point calls — the CLI, the demo, the bench, and the HTTP API
and MCP server to come — so none of them holds business logic.

A service takes `core.settings.Settings` and typed arguments, opens what it needs (registry,
vector store, Prefect) for the one call, and returns values: records, reports as dicts. It
prints nothing; progress is a callback (`kbflow.render` draws it for the CLI and the demo), and
errors are `core.errors.KbflowError`s that name the bad value.

| module | concern |
|---|---|
| `ingest` | plan an ingest, hand long media to jobs, run the flow; list and follow jobs |
| `jobs` | background jobs (ingest, research): start one, read one, notice a dead one |
| `search` | gated search as an agent or a person; the agent's tools |
| `orgs` | orgs, account managers, users and roles |
| `tokens` | API tokens: create (the secret once), list, revoke |
| `catalog` | documents, collections, agents; vector store maintenance |
| `stores` | copy an org's points between the embedded store and a Qdrant server |
| `review` | drafts, decisions, the review flow, the audit log, reconcile |
| `research` | seed bundles and research runs |
| `seeds` | seed bundles and who may run research (the part of `research` without Prefect) |
| `answers` | answers, the knowledge search, replay, turns, provenance |
| `evals` | eval runs, history, baselines, the golden set, the nightly deployment |
| `orchestration` | whether a Prefect server is set; ``kbflow server`` |

Heavy imports happen inside the functions, so importing a service is cheap. A long-lived
server keeps a `kbflow.services.context.SearchContext` open and calls `kbflow.answers` and
`kbflow.services.tools` on it directly; the services open one per call.
"""

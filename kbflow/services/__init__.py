"""App services: the one layer every surface calls — the CLI, the demo, the bench, the HTTP
routes and the MCP tools — so none of them holds business logic.

A query service (search, answers, tools) takes an open `context.SearchContext` (settings,
registry, vector store, embedder) and typed inputs, and returns a typed result or the JSON its
surfaces answer: the CLI opens a context per command, ``kbflow serve`` holds one. The other
services take `core.settings.Settings` and open what one call needs. A service prints nothing;
progress is a callback (`kbflow.render` draws it for the CLI and the demo), and errors are
`core.errors.KbflowError`s that name the bad value.

| module | concern |
|---|---|
| `context` | what a query needs, opened once (`SearchContext`, `search_context`, `store_opener`) |
| `search` | gated search as an agent or a person: the one function every search reaches |
| `tools` | the agent's tools (`TOOLS`, `call_tool`, `run_tool`); `tool_models`: their schemas |
| `answers` | cited answers, the knowledge search, replay, turns, provenance |
| `ingest` | plan an ingest once, hand long media to jobs, run the flow |
| `jobs` | background jobs: start, admit, read, notice a dead one; `job_runner`: their process |
| `uploads` | upload folders, removed or pruned as their jobs end |
| `orgs` | orgs, account managers, users and roles |
| `tokens` | API tokens: create (the secret once), list, revoke |
| `catalog` | documents, collections, agents; vector store maintenance |
| `stores` | copy an org's points between the embedded store and a Qdrant server |
| `review` | drafts, decisions, the review flow, the audit log, reconcile |
| `research` | research runs; `seeds` the seed bundles and who may run research |
| `models` | fine-tuned embedding models |
| `evals` | eval runs, history, baselines, the golden set, the nightly deployment |
| `orchestration` | whether a Prefect server is set; ``kbflow server``; `prefect_api` its REST API |
| `processes` | the Prefect servers kbflow starts: recorded, stopped, orphans reaped |

Heavy imports happen inside the functions, so importing a service is cheap.
"""

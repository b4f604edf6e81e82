"""App services: the one layer every surface calls — the CLI, the demo, the bench, the HTTP
routes and the MCP tools — so none of them holds business logic.

A query service (search, answers, tools) takes an open `context.OpenHome` (settings,
registry, vector store, embedder) and typed inputs, and returns a typed result or the JSON its
surfaces answer: the CLI opens a context per command, ``kbflow serve`` holds one. The other
services take `core.settings.Settings` and open what one call needs. A service prints nothing;
progress is a callback (`kbflow.render` draws it for the CLI and the demo), and errors are
`core.errors.KbflowError`s that name the bad value.

Grouped by domain: a sub-package owns one domain and says what in its docstring; a module
whose name starts with an underscore is private to its domain, and a domain reaches another
only through the names that domain's package lists (its ``_PUBLIC``, each imported on first
use by `core.lazy.public_names`, typed by its ``__init__.pyi``; `tests/test_house.py`).

- `query` (`context`, `search`, `answers`, `tools`, `tool_models`, `types`): what a query
  needs, opened once (`OpenHome`); gated search, the one function every search reaches;
  cited answers, the knowledge search, replay, turns, provenance; the agent's tools and their
  schemas; the JSON they return.
- `catalog` (`documents`, `orgs`, `tokens`, `stores`, `models`, `types`): documents,
  collections, agents; orgs, account managers, users and roles; API tokens; copying an org's
  points between stores; fine-tuned embedding models; the JSON they return.
- `review` (`drafts`, `inbox`): drafts, decisions, the review flow, the audit log, reconcile;
  the review inbox of ``kbflow serve``.
- `research` (`seeds`, `runs`, `types`): seed bundles and who may run research; the research
  run.
- `sources` (`definitions`, `sync`): add, list, update and remove a source and start its sync
  job; the sync and its schedules.
- `jobs` (`queue`, `uploads`, `types`): background jobs (start, admit, read, notice a dead
  one); upload folders.
- `backup` (`backups`, `restore`, `types`; private `_parts`, `_registry_copy`, `_ledger_copy`,
  `_restore_org`): make, list and prune backups and their keys; verify and restore one; the
  manifest.
- `orchestration` (`server`, `processes`, `prefect_api`, `flow_runs`): whether a Prefect server
  is set and ``kbflow server``; the Prefect servers kbflow starts; Prefect's REST API; tracked
  flow runs. It imports no other domain.

Three modules stand beside the domains: `ingest` (plan an ingest once, hand long media to jobs,
run the flow), `evals` (eval runs, history, baselines, the golden set, the nightly deployment)
and `job_runner` (``python -m kbflow.services.job_runner JOB_ID``: the process that runs one
job, above the domains whose work it runs).

A service that returns JSON says what it holds: a typed dict in its domain's `types` (or a
model, or a record), never ``dict[str, Any]`` (`tests/test_house.py`); JSON that nothing can
describe has a name of its own (`query.types.JsonSchema`, `evals.EvalRunRow`).

Heavy imports happen inside the functions, so importing a service is cheap.
"""

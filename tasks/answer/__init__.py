"""Agent answers: cited answers (cited_answer) and the tri-state knowledge search
(knowledge_search), what every turn shares and records (turns), replay from the ledger (replay),
their knowledge models (the contract: contract; offline: extractive; Claude: claude; all three
in one import for the app: knowledge), and the refusal signal (confidence)."""

"""Agent answers: cited answers (cited_answer) and the tri-state knowledge search
(knowledge_search), what every turn shares (turns), replay from the ledger (replay), their
knowledge models (offline extractive and Claude: knowledge), and the refusal signal
(confidence)."""

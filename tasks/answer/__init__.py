"""Agent answers: cited answers and the tri-state knowledge search (turns), their knowledge
models (offline extractive and Claude), and the refusal signal (confidence)."""

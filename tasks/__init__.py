"""Units of work: plain typed functions, usable without Prefect."""

"""Research: an account manager's seed bundle and the run that drafts four KB documents.

Owns seeding and who may run research, with no Prefect (`seeds`, for ``kbflow serve``), and
the research run itself (`runs`).
"""

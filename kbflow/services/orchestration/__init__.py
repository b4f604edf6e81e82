"""Orchestration: kbflow's Prefect plumbing, for every other domain.

Owns the Prefect servers kbflow starts (`processes`: recorded, stopped, orphans reaped),
whether a server is set and ``kbflow server`` (`server`), Prefect's REST API spoken without
importing Prefect (`prefect_api`), and the flow runs kbflow tracks (`flow_runs`). It imports
no other domain.
"""

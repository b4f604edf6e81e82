"""Sources: the sources an org syncs (`kbflow sources`, the source routes).

Owns adding, listing, showing, updating and removing a source and starting its sync job
(`definitions`), and the sync itself and its schedules, which run Prefect (`sync`).
"""

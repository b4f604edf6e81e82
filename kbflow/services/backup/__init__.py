"""Backup: a kbflow home copied, checked and restored (`kbflow backup`, `kbflow restore`).

Owns making, listing and pruning backups and their keys (`backups`), verifying and restoring
one (`restore`), and what a manifest holds, as typed dicts (`types`). Its private helpers (a
leading underscore) are imported only here: how each part is copied (`_parts`), a registry or
ledger in a database dumped and loaded (`_registry_copy`, `_ledger_copy`), and one org
restored into a home in use (`_restore_org`).
"""

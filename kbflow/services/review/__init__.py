"""Review: the approval gate as people use it.

Owns listing drafts, deciding on them, editing and restoring documents, the review flow, the
audit trail and reconcile (`drafts`, for the CLI and HTTP), and the review inbox of
``kbflow serve`` (`inbox`: logins, sessions, pages and decisions).
"""

"""What reviewers and admins change: the review state machine, who may do what, and moving or
deleting collections with their vectors."""

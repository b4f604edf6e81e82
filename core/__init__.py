"""kbflow's leaf core: settings, domain models, errors, the id rule, fault points and progress
events. Imports nothing of ours; every other floor imports it."""

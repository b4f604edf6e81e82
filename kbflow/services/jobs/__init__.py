"""Jobs: background work recorded in the registry and run by a process of its own.

Owns starting, admitting, reading and noticing dead jobs (`queue`) and the upload folders that
end with them (`uploads`). What a job runs is `kbflow.services.job_runner`'s, the process entry
point that stands above the domains whose work it runs.
"""

"""The HTTP service (`kbflow serve`): the app, one router per domain, what they take and answer
(`kbflow.api.schemas`), and kbflow's errors as HTTP answers."""

"""The HTTP service (`kbflow serve`): the app, its routes, and kbflow's errors as HTTP
answers."""

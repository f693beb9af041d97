"""Every benchmark of the paper as a ``TaskSpec``, one module per task or family of tasks; importing a module
registers its specs (``cblight.data.registry`` imports them when a task is looked up)."""

"""The cohort engine: `open_engine`, cohorts and their state machine, the registry, evaluation,
restore."""

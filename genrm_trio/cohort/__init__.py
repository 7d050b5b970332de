"""Cohorts of `/verify`: the state machine, the cohort model, the registry and evaluation."""

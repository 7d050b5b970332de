"""The judge client: one attempt per call against a GenRM judge (or a fleet of replicas), the
retry budget around it, and the start-up probe."""

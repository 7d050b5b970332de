"""genrm-trio: GenRM pairwise-comparison rewards for RL rollout groups, on trio."""

__version__ = "0.1.0"

"""Draw the reward-quality frontier (docs/benchmarks.md, "The frontier: reward quality against
judge calls") from `reward_quality.py --frontier`'s JSON: Kendall τ against judge calls per
rollout, one line per strategy (circular, regular, all_pairs), solid for bradley_terry and
dashed for simple_tiebreaker, one panel per judge family at N = 16 and one per family at N = 64,
p = 0.

matplotlib is not a dependency of genrm-trio; install it where you run this script.

    python benchmarks/plot_frontier.py benchmarks/results/reward-quality-frontier.json \\
        docs/images/reward-quality-frontier.png
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

STRATEGIES = ("circular", "regular", "all_pairs")
COLOURS = {"circular": "tab:blue", "regular": "tab:green", "all_pairs": "tab:red"}
METHODS = {"bradley_terry": "-", "simple_tiebreaker": "--"}


def strategy_of(graph: str) -> str:
    name = graph.removeprefix("N64-")
    return next(s for s in STRATEGIES if name.startswith(s))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print(__doc__)
        return 2
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    record = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    cells: list[dict[str, Any]] = [
        c for c in record["cells"] if c["p"] == 0.0 and c["policy"] == "pair"
    ]
    families = list(dict.fromkeys(c["family"] for c in cells))
    sizes = sorted({c["size"] for c in cells})
    fig, axes = plt.subplots(
        len(sizes), len(families), figsize=(4.2 * len(families), 3.6 * len(sizes)), squeeze=False
    )
    for row, size in enumerate(sizes):
        for col, family in enumerate(families):
            ax = axes[row][col]
            for strategy in STRATEGIES:
                for method, style in METHODS.items():
                    points = sorted(
                        (c["calls_per_rollout"], c["kendall_tau"], c["graph"])
                        for c in cells
                        if c["family"] == family
                        and c["size"] == size
                        and c["method"] == method
                        and strategy_of(c["graph"]) == strategy
                    )
                    if not points:
                        continue
                    ax.plot(
                        [p[0] for p in points],
                        [p[1] for p in points],
                        style,
                        marker="o",
                        markersize=3,
                        color=COLOURS[strategy],
                        label=f"{strategy}, {method}",
                    )
            ax.set_xscale("log", base=2)
            ax.set_title(f"{family}, N = {size}", fontsize=10)
            ax.set_xlabel("judge calls per rollout")
            ax.set_ylabel("Kendall τ")
            ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="lower right")
    fig.suptitle(
        f"Reward quality against judge calls, p = 0 ({record['groups']} groups of 16, "
        f"{record.get('groups_64')} of 64; commit {record['commit'][:7]})",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(args[1], dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Gym's reward-profile statistics over `/verify` rows: pure computations, no I/O
(docs/http-api.md, "POST /aggregate_metrics").
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import Any, final

from genrm_trio.domain.codec import encode_json

__all__ = ["NumberTooLarge", "aggregate_metrics"]


@final
class NumberTooLarge(ValueError):
    """A metric value that does not fit a double; the message names its key. The HTTP layer
    answers it with a 422 `number_too_large` item."""


def _number(value: Any) -> float | int | None:
    """A metric value for /aggregate_metrics: JSON numbers, not booleans."""
    if type(value) is int or type(value) is float:
        return value
    return None


def _describe(columns: Mapping[str, list[float | int]], into: dict[str, Any]) -> None:
    stats: dict[str, dict[str, Any]] = {"mean": {}, "max": {}, "min": {}, "median": {}, "std": {}}
    for key, values in columns.items():
        try:
            floats = [float(v) for v in values]
        except OverflowError:
            raise NumberTooLarge(f"{key} does not fit a double") from None
        stats["mean"][key] = math.fsum(floats) / len(floats)
        stats["max"][key] = max(values)
        stats["min"][key] = min(values)
        stats["median"][key] = statistics.median(floats)
        stats["std"][key] = statistics.stdev(floats) if len(floats) > 1 else 0.0
    for stat, per_key in stats.items():
        for key, value in per_key.items():
            into[f"{stat}/{key}"] = value


def aggregate_metrics(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Gym's reward-profile aggregation without masked rows (docs/http-api.md,
    "POST /aggregate_metrics"). Raises NumberTooLarge for a value that does not fit a double."""
    if not rows:
        return {"group_level_metrics": [], "agent_metrics": {}, "key_metrics": {}}
    overall: dict[str, list[float | int]] = {}
    per_task: dict[bytes, dict[str, list[float | int]]] = {}
    measured_tasks: set[bytes] = set()
    all_tasks: set[bytes] = set()
    task_values: dict[bytes, Any] = {}
    masked = 0
    for row in rows:
        task = row.get("_ng_task_index", 0)
        task_key = encode_json(task)  # any JSON value groups; equal values share a group
        task_values.setdefault(task_key, task)
        all_tasks.add(task_key)
        if row.get("mask_sample") is True:
            masked += 1
            continue
        measured_tasks.add(task_key)
        group = per_task.setdefault(task_key, {})
        for key, value in row.items():
            if key.startswith("_"):
                continue
            number = _number(value)
            if number is None:
                continue
            overall.setdefault(key, []).append(number)
            group.setdefault(key, []).append(number)
    agent: dict[str, Any] = {}
    _describe(overall, agent)
    if masked:
        agent["coverage/measured_rollouts"] = len(rows) - masked
        agent["coverage/masked_rollouts"] = masked
        agent["coverage/measured_tasks"] = len(measured_tasks)
        agent["coverage/fully_masked_tasks"] = len(all_tasks - measured_tasks)
    groups: list[dict[str, Any]] = []

    def order(task_key: bytes) -> tuple[int, float, bytes]:
        value = task_values[task_key]
        if type(value) is int or type(value) is float:
            return (0, value, b"")
        return (1, 0.0, task_key)

    for task_key in sorted(per_task, key=order):
        entry: dict[str, Any] = {"_ng_task_index": task_values[task_key]}
        _describe(per_task[task_key], entry)
        groups.append(entry)
    key_metrics = {k: v for k, v in agent.items() if k.startswith("mean/")}
    return {"group_level_metrics": groups, "agent_metrics": agent, "key_metrics": key_metrics}

"""Restoring records into a running engine (docs/durable-state.md, "Restore rules"): which
terminal records and watermarks a checkpoint or the store adds, leaves alone or refuses
(`plan_restore`), and how what is added becomes retained cohorts and watermarks
(`apply_restore`). The engine runs both under its lock, with the one store commit between them,
so nothing is visible before it is durable and nothing is applied when the commit fails. A raised
watermark supersedes the group's active older attempts exactly as a newer request does
(`Registry.supersede`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from genrm_trio.domain.records import TerminalRecord, WatermarkRecord
from genrm_trio.engine.cohort import Cohort
from genrm_trio.engine.registry import Registry

__all__ = ["RestorePlan", "apply_restore", "plan_restore"]


@dataclass(slots=True)
class RestorePlan:
    """What a restore will do: records to add by key, watermarks to raise by group id, how many
    records are already present as given, and the conflicts (reported, never applied)."""

    adds: dict[str, TerminalRecord] = field(default_factory=dict)
    raises: dict[str, WatermarkRecord] = field(default_factory=dict)
    unchanged: int = 0
    conflicts: list[dict[str, str]] = field(default_factory=list)


def plan_restore(
    registry: Registry, records: Iterable[TerminalRecord], watermarks: Iterable[WatermarkRecord]
) -> RestorePlan:
    """An absent key is added (the first record of a key given twice wins; an identical second
    one is unchanged), an identical terminal record is left alone, anything else conflicts; a
    watermark is raised when its prompt digest agrees with the one held."""
    plan = RestorePlan()
    for record in records:
        present = registry.get(record.key)
        if present is None and record.key in plan.adds:
            present_record: TerminalRecord | None = plan.adds[record.key]
            terminal = True
        elif present is not None:
            present_record, terminal = present.record, present.terminal
        else:
            plan.adds[record.key] = record
            continue
        if terminal and present_record == record:
            plan.unchanged += 1
        else:
            reason = "active cohort" if not terminal else "different record"
            plan.conflicts.append({"key": record.key, "reason": reason})
    for mark in watermarks:
        current: WatermarkRecord | None = plan.raises.get(mark.group_id)
        if current is None and (held := registry.watermarks.get(mark.group_id)) is not None:
            current = WatermarkRecord(mark.group_id, held.latest_attempt, held.prompt_digest)
        if current is not None and current.prompt_digest != mark.prompt_digest:
            plan.conflicts.append({"group_id": mark.group_id, "reason": "different prompt digest"})
            continue
        if current is None or mark.latest_attempt > current.latest_attempt:
            plan.raises[mark.group_id] = mark
    return plan


def apply_restore(
    registry: Registry,
    plan: RestorePlan,
    *,
    size: int,
    now: float,
    age_s: Mapping[str, float] | None = None,
    watermark_age_s: Mapping[str, float] | None = None,
) -> int:
    """Adopt each added record as a retained terminal cohort of `size` members (its retention
    clock set back by ``age_s[key]``) and raise each watermark (set back by
    ``watermark_age_s[group_id]``), failing the group's active older attempts as superseded.
    Restored members replay without judging. Retention applies at once. Returns how many active
    cohorts were superseded."""
    superseded = 0
    for record in plan.adds.values():
        cohort = Cohort(
            key=record.key,
            group_id=record.group_id,
            group_attempt=record.group_attempt,
            prompt_digest=record.prompt_digest,
            size=size,
            history=(),
            principle=None,
            baseline=None,
            baseline_digest=None,
            rubric_ids=None,
            created_at=now,
            collect_deadline=now,
            host=registry,
            state=record.state,
            record=record.compacted(),
        )
        registry.adopt(cohort, now - (age_s or {}).get(record.key, 0.0))
    for mark in plan.raises.values():
        age = (watermark_age_s or {}).get(mark.group_id, 0.0)
        registry.set_watermark(mark.group_id, mark.latest_attempt, mark.prompt_digest, now - age)
        superseded += registry.supersede(mark.group_id, mark.latest_attempt)
    # retention now, not when the next group ends: a restore beyond max_terminal_cohorts
    # would otherwise hold every record it added until then
    registry.prune(now)
    return superseded

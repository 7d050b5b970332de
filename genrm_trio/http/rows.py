"""The `/verify` reply rows built from engine outcomes: the scored row, the held request that
renders it without decoding the body again, and the judge failsafe row (docs/http-api.md,
"Scored member: 200", "Masked member or judge failure: 200 failsafe row").
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, final

from genrm_trio.domain.codec import (
    decode_json,
    decode_json_in_steps,
    encode_json,
    encode_json_in_steps,
    release_in_steps,
)
from genrm_trio.domain.model import JSONValue, Scored
from genrm_trio.domain.records import compressed, result_dict, result_json
from genrm_trio.http.schema import ECHO_KEYS, VERIFY_FIELDS, VerifyRequest

__all__ = ["FAILSAFE_REASON_LIMIT", "HeldVerify", "failsafe_row", "success_row"]

FAILSAFE_REASON_LIMIT = 2000  # failure_reason is cut to this many characters (docs/http-api.md)

# A declared field sent by its field name is dumped by its wire name.
_NAME_TO_ALIAS = {name: alias for alias, name in VERIFY_FIELDS.items() if name != alias}
# Failsafe dump order: every declared field by alias except `_ng_rollout_id` (docs/http-api.md,
# "Masked member or judge failure: 200 failsafe row").
_DUMP_FIELDS: tuple[str, ...] = (
    "responses_create_params",
    "response",
    "principle",
    "prompt_id",
    "_ng_task_index",
    "_ng_group_id",
    "_ng_group_attempt",
    "_ng_rollout_index",
    "expected_rubric_ids",
)
_CAPTURE_KEYS = frozenset({"_ng_rollout_id", "capture_rollout_id"})


def success_row(request: VerifyRequest, outcome: Scored) -> dict[str, JSONValue]:
    """The scored `/verify` row (docs/http-api.md, "Scored member: 200"): echoes, the result
    keys, identity keys."""
    body = request.body
    inp = request.input
    row: dict[str, JSONValue] = {
        "responses_create_params": body["responses_create_params"],
        "response": body["response"],
    }
    row.update(result_dict(outcome.result))
    row["_ng_group_id"] = inp.group_id
    row["_ng_group_attempt"] = inp.group_attempt
    row["_ng_rollout_index"] = inp.rollout_index
    return row


@final
@dataclass(frozen=True, slots=True)
class HeldVerify:
    """What a `/verify` request keeps while it waits for its group: the echoed fields already
    encoded as the reply will carry them, the identity keys, and the rest of the body.

    The decoded body of an agent's request is ~8 KB of dicts and strings with 1,000-character
    answers; its echo as compact JSON is ~2.3 KB, and with a group's members waiting in the
    hundreds that is most of a request's footprint. Encoding it now instead of at the reply costs
    nothing extra; the failsafe row (masked members) decodes it again. A long echo (long answers,
    reasoning traces) is kept zlib-compressed (:func:`compressed`; the agent's body with a
    1,000-character answer stays plain): its text is the second copy of the answer the cohort
    holds anyway, and (e) of the benchmarks holds 15,000 of them.
    """

    echo: bytes  # {"responses_create_params":…,"response":…}, zlib-compressed if echo_compressed
    # the body's other keys, in their order; from a large body, as zlib-compressed JSON (a
    # client's extra keys could otherwise hold 25 times their bytes while the group waits)
    rest: dict[str, Any] | bytes
    group_id: str | None
    group_attempt: int
    rollout_index: int | None
    echo_compressed: bool = False

    @staticmethod
    def of(request: VerifyRequest, *, packed_rest: bytes | None = None) -> HeldVerify:
        """What `request` keeps; `packed_rest`: its other keys packed already
        (`split_verify_body`), else they are taken from its body."""
        body = request.body
        inp = request.input
        echo = encode_json({key: body[key] for key in ECHO_KEYS})
        packed = compressed(echo)
        rest = (
            {key: value for key, value in body.items() if key not in ECHO_KEYS}
            if packed_rest is None
            else packed_rest
        )
        return HeldVerify(
            echo=echo if packed is None else packed,
            rest=rest,
            group_id=inp.group_id,
            group_attempt=inp.group_attempt,
            rollout_index=inp.rollout_index,
            echo_compressed=packed is not None,
        )

    def rest_dict(self) -> dict[str, Any]:
        """The body's keys other than the echoed ones."""
        if isinstance(self.rest, dict):
            return self.rest
        rest = decode_json(zlib.decompress(self.rest))
        assert type(rest) is dict
        return rest

    def echo_json(self) -> bytes:
        """The echoed fields as compact JSON: ``{"responses_create_params":…,"response":…}``."""
        return zlib.decompress(self.echo) if self.echo_compressed else self.echo

    def body(self) -> dict[str, Any]:
        """The request body again (equal to the decoded one; the echoed fields last)."""
        echoed = decode_json(self.echo_json())
        assert type(echoed) is dict
        return {**self.rest_dict(), **echoed}

    def success_json(self, outcome: Scored) -> bytes:
        """The encoded scored row: ``encode_json(success_row(...))``, with the result spliced in
        as the JSON it is stored as (a :class:`PackedResult`) instead of decoded and encoded."""
        inner = result_json(outcome.result)[1:-1].encode("ascii")
        tail = encode_json(
            {
                "_ng_group_id": self.group_id,
                "_ng_group_attempt": self.group_attempt,
                "_ng_rollout_index": self.rollout_index,
            }
        )
        middle = b"," + inner + b"," if inner else b","
        return self.echo_json()[:-1] + middle + tail[1:]

    def failsafe_row(self, message: str) -> dict[str, JSONValue]:
        """:func:`failsafe_row` of the request this was made from."""
        return failsafe_row(self.body(), message)

    @property
    def packed(self) -> bool:
        """Whether this was made from a large body (its other keys packed): its failsafe row is
        then built by :meth:`failsafe_json_in_steps` in a worker thread."""
        return type(self.rest) is bytes

    def failsafe_json_in_steps(self, message: str) -> bytes:
        """``encode_json(self.failsafe_row(message))``, for a worker thread: decoded, built,
        encoded and freed a member at a time (a body of a million keys is seconds of single
        C calls otherwise)."""
        rest = self.rest
        body = dict(rest) if isinstance(rest, dict) else decode_json_in_steps(zlib.decompress(rest))
        assert type(body) is dict
        echoed = decode_json(self.echo_json())
        assert type(echoed) is dict
        body.update(echoed)
        row = failsafe_row(body, message)
        try:
            return encode_json_in_steps(row)
        finally:
            release_in_steps(row, levels=1)
            release_in_steps(body, levels=1)


def failsafe_row(body: dict[str, Any], message: str) -> dict[str, JSONValue]:
    """The judge failsafe row for a masked member or a judge-kind failure (docs/http-api.md).

    The request body dumped by alias (absent declared fields added: `_ng_group_attempt` 0, the
    others null; `_ng_rollout_id` removed; extra keys kept), then the failure keys. The body is
    not mutated; `instance_config` is a shallow copy.
    """
    row: dict[str, JSONValue] = dict.fromkeys(_DUMP_FIELDS)
    row["_ng_group_attempt"] = 0
    for key, value in body.items():
        if key in _CAPTURE_KEYS:
            continue
        alias = _NAME_TO_ALIAS.get(key)
        if alias is not None:
            if alias in body:
                continue  # the alias was sent too and wins
            key = alias
        row[key] = value
    reason = message[:FAILSAFE_REASON_LIMIT]
    instance_config = body.get("instance_config")
    merged: dict[str, JSONValue] = dict(instance_config) if type(instance_config) is dict else {}
    merged["mask_sample"] = True
    row["reward"] = 0.0
    row["mask_sample"] = True
    row["failure_kind"] = "judge_failed"
    row["failure_reason"] = reason
    row["instance_config"] = merged
    row["_ng_failure_class"] = "judge_failed"
    row["_ng_failure_judge_error"] = reason
    return row

"""A policy stand-in: deterministic answers to ordinary (policy) chat and Responses requests, so
that one `genrm-trio sim-judge --policy` can be both models of a GPU-free NeMo Gym trial.

The n-th request with a given prompt always gets the same answer (the prompt's digest, the seed
and n pick it), and the answers to one prompt differ from each other: a group of N rollouts of
one task gets N distinct answers, whose simulated qualities (`verdicts`) differ, so the group's
comparisons are not all ties. Pure apart from the per-prompt counters.
"""

from __future__ import annotations

import hashlib
from typing import Final, final

__all__ = ["PolicyStandIn"]

_STYLES: Final = (
    "Short answer: {n}.",
    "Let me think step by step. First, the question asks for {n}. So the answer is {n}.",
    "## Answer\n\n- **{n}**\n- because it follows from the premise\n\nHope this helps!",
    "The answer is {n}, and here is a longer justification: " + "details " * 12,
)
_PROMPTS_KEPT: Final = 65536


@final
class PolicyStandIn:
    """Answers policy requests: `answer(prompt)` for the prompt's text (its messages joined)."""

    def __init__(self, seed: int = 0) -> None:
        self._seed = seed
        self._seen: dict[bytes, int] = {}
        self.calls = 0

    def answer(self, prompt: str) -> str:
        key = hashlib.sha256(prompt.encode("utf-8", errors="surrogatepass")).digest()
        if len(self._seen) >= _PROMPTS_KEPT and key not in self._seen:
            self._seen.clear()  # bounded: a long run starts numbering prompts afresh
        occurrence = self._seen.get(key, 0)
        self._seen[key] = occurrence + 1
        self.calls += 1
        draw = hashlib.sha256(f"{self._seed}\0policy\0{occurrence}\0".encode() + key).digest()
        style = _STYLES[draw[0] % len(_STYLES)]
        # the occurrence keeps the answers to one prompt distinct whatever the draw
        number = int.from_bytes(draw[1:4], "big") % 1000
        return style.format(n=f"{number} (variant {occurrence})")

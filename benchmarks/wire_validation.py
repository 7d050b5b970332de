"""Per-request cost of validating a realistic `/verify` body.

    python benchmarks/wire_validation.py [--number 20000] [--repeat 9]

The body is the load generator's (`bench.verify_body`: NeMo Gym's simple agent's shape, all 30
create-params keys sent, a 1,000-character answer; 2,258 bytes). Prints the best time per call
of `parse_verify` on the decoded body and of `decode_body` + `parse_verify` on the bytes. The
numbers in docs/http-api.md ("Per-request cost") come from this script.
"""

from __future__ import annotations

import argparse
import timeit

from genrm_trio.app import bench
from genrm_trio.domain.codec import encode_json
from genrm_trio.http.schema import decode_body, parse_verify


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    body = bench.verify_body(
        task=1, rollout=2, group_id="g", attempt=0, prompt="What is 2+2?", answer="x" * 1000
    )
    raw = encode_json(body)
    value = decode_body(raw)
    for name, call in (
        ("parse_verify", lambda: parse_verify(value)),
        ("decode_body + parse_verify", lambda: parse_verify(decode_body(raw))),
    ):
        best = min(timeit.repeat(call, number=args.number, repeat=args.repeat)) / args.number
        print(f"{name}: {best * 1e6:.2f} us ({len(raw)} bytes)")


if __name__ == "__main__":
    main()

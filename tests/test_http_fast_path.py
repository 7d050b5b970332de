"""The ASGI fast path of POST /verify and POST /compare (genrm_trio/http/app.py `_App`).

Its replies are covered route by route in test_http_app.py (Quart's test client goes through
it); here: what it keeps alive while a request waits, and its body-reading outcomes.
"""

from __future__ import annotations

from typing import Any

import trio
from fake_engine import FakeEngine

from genrm_trio.config import Settings
from genrm_trio.http.app import _receive_body, create_app


async def test_the_raw_body_is_not_held_while_the_route_runs() -> None:
    app: Any = create_app(FakeEngine(), Settings())
    box = [b'{"a": 1}']
    seen: list[int] = []

    async def route(data: bytes) -> tuple[int, object, None]:
        seen.append(len(box))  # the box was emptied before the route started
        return 200, {"ok": True}, None

    scope: Any = {"method": "POST", "path": "/x"}
    status, body, headers = await app._run_route(route, box, scope)
    assert (status, body, seen) == (200, b'{"ok":true}', [0])
    assert headers == [(b"content-type", b"application/json"), (b"content-length", b"11")]


def _receiver(*messages: dict[str, Any]) -> Any:
    queue = list(messages)

    async def receive() -> dict[str, Any]:
        if not queue:
            await trio.sleep_forever()
        return queue.pop(0)

    return receive


async def test_body_reading_outcomes(autojump_clock: trio.testing.MockClock) -> None:
    part = {"type": "http.request", "body": b"ab", "more_body": True}
    last = {"type": "http.request", "body": b"c", "more_body": False}
    assert await _receive_body(_receiver(part, last), 3, 60) == [b"abc"]
    assert await _receive_body(_receiver(last), None, None) == [b"c"]
    assert await _receive_body(_receiver(part, last), 2, 60) == 413
    assert await _receive_body(_receiver(part, {"type": "http.disconnect"}), 9, 60) == 0
    start = trio.current_time()
    assert await _receive_body(_receiver(part), 9, 60) == 408
    assert trio.current_time() - start == 60

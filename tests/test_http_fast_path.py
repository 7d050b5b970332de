"""The ASGI layer in front of Quart and its POST routes (genrm_trio/http/asgi.py `App`).

Its replies are covered route by route in test_http_app.py (Quart's test client goes through
it); here: what it keeps alive while a request waits, its body-reading outcomes, and that it is
the one layer for every route (body limit, 405, error mapping; Quart serves no POST route).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import trio
from fake_engine import FakeEngine

from genrm_trio.config import Settings
from genrm_trio.domain.model import CohortView
from genrm_trio.http.app import create_app
from genrm_trio.http.asgi import PUBLIC_PATHS, _receive_body
from genrm_trio.http.openapi import openapi_document


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


# --- one HTTP layer for every route ------------------------------------------------------------

POST_ROUTES = ["/verify", "/compare", "/seed_session", "/close_session", "/aggregate_metrics"]


def test_quart_serves_no_route_that_takes_a_body() -> None:
    app: Any = create_app(FakeEngine(), Settings())
    assert sorted(app.post_routes) == sorted([*POST_ROUTES, "/checkpoint"])
    for rule in app.url_map.iter_rules():
        assert "POST" not in (rule.methods or set()), rule.rule


async def _call(app: Any, method: str, path: str, body: bytes, **headers: str) -> Any:
    client = app.test_client()
    return await client.open(path, method=method, data=body, headers=headers)


async def test_every_post_route_has_the_body_limit_and_the_405() -> None:
    app: Any = create_app(FakeEngine(), Settings.model_validate({"server": {"max_body_bytes": 10}}))
    for path in [*POST_ROUTES, "/checkpoint"]:
        big = b"{" + b" " * 20 + b"}"
        response = await _call(app, "POST", path, big, **{"Content-Length": str(len(big))})
        assert response.status_code == 413, path
        assert await response.get_json() == {"detail": "request body exceeds 10 bytes"}
        assert response.headers["Connection"] == "close"
        response = await _call(app, "PUT", path, b"")
        assert response.status_code == 405, path
        assert await response.get_json() == {"detail": "Method Not Allowed"}
        expected = "GET, HEAD, POST" if path == "/checkpoint" else "POST"
        assert response.headers["Allow"] == expected


async def test_quart_routes_use_the_same_error_mapping(caplog: Any) -> None:
    import logging

    app: Any = create_app(FakeEngine(), Settings())  # FakeEngine has no records: GET fails
    with caplog.at_level(logging.ERROR, logger="genrm_trio.http"):
        response = await _call(app, "GET", "/checkpoint", b"")
    assert response.status_code == 500
    assert await response.get_json() == {"detail": "internal error"}
    [record] = [r for r in caplog.records if r.name == "genrm_trio.http"]
    assert record.getMessage() == "internal error on GET /checkpoint"


async def test_quart_replies_get_the_send_timeout_and_close(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app: Any = create_app(FakeEngine(), Settings())
    sent: list[dict[str, Any]] = []

    async def stuck(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body":
            await trio.sleep_forever()  # a client that stopped reading

    send = app._quart_send(stuck, True)
    start = trio.current_time()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"x", "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})  # dropped
    assert trio.current_time() - start == 60
    assert sent[0]["headers"] == [(b"connection", b"close")]
    assert len(sent) == 2


async def test_quart_is_handed_no_body() -> None:
    from genrm_trio.http.asgi import _bodiless

    part = {"type": "http.request", "body": b"ab", "more_body": True}
    last = {"type": "http.request", "body": b"c", "more_body": False}
    receive = _bodiless(_receiver(part, last, {"type": "http.disconnect"}))
    assert await receive() == {"type": "http.request", "body": b"", "more_body": False}
    assert await receive() == {"type": "http.disconnect"}


def test_the_openapi_document_lists_exactly_the_routes_served() -> None:
    """One list of routes: what the app serves (Quart's GET rules and the ASGI layer's POST
    routes) is what `openapi_document` describes, method by method, and the public paths are
    the ones the bearer check lets through."""
    app: Any = create_app(FakeEngine(), Settings())
    served: dict[str, set[str]] = {}
    for rule in app.url_map.iter_rules():
        if rule.endpoint != "static":
            served.setdefault(rule.rule, set()).update((rule.methods or set()) & {"GET"})
    for path in app.post_routes:
        served.setdefault(path, set()).add("POST")
    doc = openapi_document(title="genrm-trio", version="1", auth=True)
    described = {path: {method.upper() for method in item} for path, item in doc["paths"].items()}
    assert described == served
    public = {
        path for path, item in doc["paths"].items() if item.get("get", {}).get("security") == []
    }
    assert public == set(PUBLIC_PATHS)


def test_cohort_info_is_cohort_view_field_by_field() -> None:
    doc = openapi_document(title="genrm-trio", version="1", auth=False)
    schema = doc["components"]["schemas"]["CohortInfo"]
    assert list(schema["properties"]) == [f.name for f in dataclasses.fields(CohortView)]
    assert schema["required"] == list(schema["properties"])

"""`genrm-trio checkpoint export|restore [--url URL] [FILE]` (docs/durable-state.md, "The command").

`export` writes the server's `GET /checkpoint` body to FILE (atomically: a temporary file in the
same directory, fsynced, then renamed) or to stdout. `restore` sends FILE (or stdin) to
`POST /checkpoint` and prints the reply. Exit codes: 0 done without conflicts, 1 restored with
conflicts, 2 for a 422, any other HTTP error, a transport error or an unreadable/unwritable file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from genrm_trio.app.arguments import DEFAULT_SERVER_URL, positive, say, write_atomically

__all__ = ["add_checkpoint_arguments", "checkpoint_url", "run_checkpoint_command"]


def add_checkpoint_arguments(subparsers: Any) -> None:
    """Add the `checkpoint` command (with `export` and `restore`) to the CLI's subparsers."""
    parser = subparsers.add_parser(
        "checkpoint",
        help="export or restore a running server's cohort records (checkpoint v1 JSON)",
        description=(
            "Export the terminal cohort records and group watermarks of a running server, or "
            "merge such an export into one. Exit 0 on success, 1 when a restore reported "
            "conflicts, 2 on a rejected checkpoint (422) or a transport error."
        ),
    )
    actions = parser.add_subparsers(
        dest="checkpoint_action", metavar="ACTION", parser_class=type(parser), required=True
    )
    for name, summary, file_help in (
        ("export", "write GET /checkpoint to FILE or stdout", "output file (default: stdout)"),
        ("restore", "send FILE or stdin to POST /checkpoint", "input file (default: stdin)"),
    ):
        action = actions.add_parser(name, help=summary, description=summary)
        action.add_argument(
            "--url", default=DEFAULT_SERVER_URL, metavar="URL", help="server base URL"
        )
        action.add_argument("file", nargs="?", metavar="FILE", help=file_help)
        action.add_argument(
            "--api-key-env", metavar="VAR", help="variable holding the server's bearer token"
        )
        action.add_argument(
            "--timeout",
            metavar="SECONDS",
            type=positive,
            default=300.0,
            help="seconds for the whole request",
        )
    parser.set_defaults(handler=run_checkpoint_command)


def checkpoint_url(base: str) -> str:
    """`{base}/checkpoint`, unless `base` already names the route."""
    path = urlsplit(base).path.rstrip("/")
    if path.endswith("/checkpoint"):
        return base
    return base.rstrip("/") + "/checkpoint"


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict) and "detail" in body:
        detail = body["detail"]
        return detail if isinstance(detail, str) else json.dumps(detail)[:500]
    return json.dumps(body)[:500]


def _read_input(path: str | None) -> bytes:
    if path is None:
        return sys.stdin.buffer.read()
    return Path(path).read_bytes()


def run_checkpoint_command(args: argparse.Namespace) -> int:
    """Run `checkpoint export` or `checkpoint restore`; returns the exit code."""
    action: str = args.checkpoint_action
    url = checkpoint_url(args.url)
    headers = {"accept": "application/json"}
    if args.api_key_env:
        token = os.environ.get(args.api_key_env, "")
        if not token:
            say(f"checkpoint {action}: environment variable {args.api_key_env} is unset or empty")
            return 2
        headers["authorization"] = f"Bearer {token}"
    data = b""
    if action == "restore":
        try:
            data = _read_input(args.file)
        except OSError as exc:
            say(f"checkpoint restore: cannot read {args.file}: {exc.strerror or exc}")
            return 2
        headers["content-type"] = "application/json"
    try:
        with httpx.Client(timeout=args.timeout, trust_env=False, follow_redirects=False) as client:
            if action == "export":
                response = client.get(url, headers=headers)
            else:
                response = client.post(url, content=data, headers=headers)
    except httpx.HTTPError as exc:
        reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        say(f"checkpoint {action}: cannot reach {url}: {reason}")
        return 2
    if response.status_code != 200:
        say(f"checkpoint {action}: HTTP {response.status_code}: {_detail(response)}")
        return 2
    try:
        body = response.json()
    except ValueError:
        say(f"checkpoint {action}: the reply from {url} is not JSON")
        return 2
    if action == "export":
        if not (isinstance(body, dict) and body.get("version") == 1):
            say(f"checkpoint export: the reply from {url} is not a checkpoint v1")
            return 2
        content = response.content.rstrip(b"\n") + b"\n"
        if args.file is None:
            sys.stdout.buffer.write(content)
            sys.stdout.flush()
        else:
            try:
                write_atomically(args.file, content)
            except OSError as exc:
                say(f"checkpoint export: cannot write {args.file}: {exc.strerror or exc}")
                return 2
        return 0
    print(response.text, flush=True)
    conflicts = body.get("conflicts") if isinstance(body, dict) else None
    if conflicts:
        say(f"checkpoint restore: {len(conflicts)} record(s) conflicted and were not restored")
        return 1
    return 0

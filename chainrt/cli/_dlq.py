"""``chainrt dlq list|show|retry|drop``: the dead letters of a ``chainrt serve`` fleet.

Through the HTTP API (``/v1/dlq``, the ``admin`` scope), so it works the same for a Redis fleet
and for a lone SQLite server; ``--token`` or ``CHAINRT_API_TOKEN`` when the server has tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from ..errors import ChainRTError, InputError

__all__ = ["add_command", "dlq"]

_DEFAULT_SERVER = "http://127.0.0.1:8080"


def add_command(sub: Any) -> None:
    """Add ``dlq`` to the ``chainrt`` parser."""
    dlq_p = sub.add_parser("dlq", help="dead letters: queue entries that failed for good")
    actions = dlq_p.add_subparsers(dest="dlq_action", required=True)
    for name, text in (
        ("list", "list the dead letters, oldest first"),
        ("show", "show one dead letter"),
        ("retry", "queue its run again (a resume) and remove the letter"),
        ("drop", "remove the letter (its run stays as it is)"),
    ):
        p = actions.add_parser(name, help=text)
        if name != "list":
            p.add_argument("id", help="the dead letter's id (see `chainrt dlq list`)")
        else:
            p.add_argument("--limit", type=int, default=100)
        p.add_argument(
            "--server", help=f"server URL (default: CHAINRT_SERVER or {_DEFAULT_SERVER})"
        )
        p.add_argument("--token", help="API token (default: CHAINRT_API_TOKEN)")
        p.add_argument("--json", action="store_true", help="print JSON")


async def dlq(args: argparse.Namespace) -> int:
    """Run one ``chainrt dlq`` action."""
    import httpx

    server = (args.server or os.environ.get("CHAINRT_SERVER") or _DEFAULT_SERVER).rstrip("/")
    token = args.token or os.environ.get("CHAINRT_API_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    action = args.dlq_action
    try:
        async with httpx.AsyncClient(base_url=server, timeout=30.0, headers=headers) as client:
            if action == "list":
                answer = await client.get("/v1/dlq", params={"limit": args.limit})
            elif action == "show":
                answer = await client.get(f"/v1/dlq/{args.id}")
            else:
                answer = await client.post(f"/v1/dlq/{args.id}/{action}", json={})
    except httpx.HTTPError as exc:
        raise ChainRTError(f"cannot reach chainrt serve at {server}: {exc}") from None
    payload = _payload(answer, server)
    if args.json:
        print(json.dumps(payload, ensure_ascii=False))
    elif action == "list":
        letters = payload if isinstance(payload, list) else []
        for letter in letters:
            print(_line(letter))
        if not letters:
            print("no dead letters")
    elif action == "show":
        for key, value in payload.items():
            print(f"{key:<11} {value}")
    else:
        letter = payload.get("retried") or payload.get("dropped") or {}
        done = "queued again (as a resume)" if action == "retry" else "dropped"
        print(f"dead letter {letter.get('id')} (run {letter.get('run_id')}): {done}")
    return 0


def _line(letter: dict[str, Any]) -> str:
    dead_at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(letter.get("dead_at") or 0)))
    return (
        f"{letter.get('id')}  {dead_at}  run {letter.get('run_id')}  "
        f"chain {letter.get('chain') or '-'}  x{letter.get('deliveries')}  {letter.get('reason')}"
    )


def _payload(answer: Any, server: str) -> Any:
    try:
        payload = answer.json()
    except ValueError:
        payload = None
    if answer.status_code >= 400:
        error = payload.get("error", {}) if isinstance(payload, dict) else {}
        message = error.get("message") if isinstance(error, dict) else None
        text = f"{server} answered {answer.status_code}: {message or answer.text[:200]}"
        if answer.status_code in (401, 403, 404):
            raise InputError(text)
        raise ChainRTError(text)
    return payload

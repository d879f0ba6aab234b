"""Conversation memory for the support agent: one JSON line per answered question.

The file is ``.chainrt/memory.jsonl`` under the working directory (``SUPPORT_MEMORY_FILE``
overrides it). The step's idempotency key makes a re-run after a crash write nothing twice.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from chainrt import StepContext


def _path() -> Path:
    return Path(os.environ.get("SUPPORT_MEMORY_FILE", ".chainrt/memory.jsonl"))


def remember(
    user_id: str, session_id: str, question: str, answer: Any, ctx: StepContext
) -> dict[str, Any]:
    """Append the exchange unless this step of this run already did."""
    path = _path()
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                try:
                    seen = json.loads(line).get("key")
                except (ValueError, AttributeError):
                    continue  # a torn last line from a crash is not ours to repair
                if seen == ctx.idempotency_key:
                    return {"stored": False, "reason": "already stored", "key": ctx.idempotency_key}
    entry = {
        "key": ctx.idempotency_key,
        "user": user_id,
        "session": session_id,
        "q": question,
        "a": answer,
    }
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry, ensure_ascii=False) + "\n")
    return {"stored": True, "key": ctx.idempotency_key}

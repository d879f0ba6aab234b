"""``chainrt schema --tools CHAIN``: the JSON Schemas the chain's agent steps offer their models.

Resolving a tool imports its file (the chain's own code runs, as it does when the chain runs);
``chainrt validate`` never does.
"""

from __future__ import annotations

import json
import sys

from .._errors import ChainRTError

__all__ = ["print_tool_schemas"]


def print_tool_schemas(chain: str) -> int:
    """Print ``{step id: [OpenAI tools entries]}`` for ``chain``; the exit code (2: bad chain)."""
    from .._settings import get_settings
    from ..agent._tools import tool_schemas
    from ..spec import load_spec, parse_allowed_modules

    try:
        loaded = load_spec(chain)
        allowed = tuple(parse_allowed_modules(get_settings().allowed_modules))
        schemas = tool_schemas(loaded.spec, loaded.source_dir, allowed)
    except ChainRTError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    if not schemas:
        print(f"{chain}: no agent steps, no tools", file=sys.stderr)
        return 2
    print(json.dumps(schemas, indent=2))
    return 0

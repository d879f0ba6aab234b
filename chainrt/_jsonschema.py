"""JSON Schema checks for ``llm.json_schema`` (chain load) and answers (dispatch).

``jsonschema`` is imported on first use, so loading a chain without a schema costs nothing.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["check_schema", "schema_violation"]

MAX_SCHEMA_BYTES = 64 * 1024
"""A bigger schema is refused: it would only make a grammar too large to decode with."""


def check_schema(schema: Any) -> None:
    """Raise ValueError (one line: where and why) unless ``schema`` is a valid JSON Schema."""
    if not isinstance(schema, dict):
        raise ValueError(f"a JSON Schema must be a mapping, not {type(schema).__name__}")
    size = len(json.dumps(schema))
    if size > MAX_SCHEMA_BYTES:
        raise ValueError(f"the JSON Schema is {size} bytes; the limit is {MAX_SCHEMA_BYTES}")
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top level)"
        raise ValueError(f"not a valid JSON Schema: at {where}: {exc.message}") from None


def schema_violation(instance: Any, schema: dict[str, Any]) -> str | None:
    """Why ``instance`` does not match ``schema`` (one line), or None when it does."""
    from jsonschema import Draft202012Validator

    error = next(iter(Draft202012Validator(schema).iter_errors(instance)), None)
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
    return f"at {where}: {error.message}"

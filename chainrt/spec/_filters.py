"""The values side of templates: the filters, JSON rendering and the cap on what is rendered.

A rendered string is capped at :data:`MAX_RENDERED_CHARS`: each ``tojson`` of a string at least
doubles its quotes and backslashes, so 16 chained ``tojson`` on a 3 KB input once built a 375 MiB
argument. The cap is checked before a string is escaped (when the size it must reach is already
over) and after every filter, so no intermediate value grows far past it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Final

from .._errors import TemplateError

__all__ = ["FILTERS", "FILTER_NAMES", "MAX_RENDERED_CHARS", "kind", "to_json", "too_large"]

MAX_RENDERED_CHARS: Final = 4 * 1024 * 1024
"""Largest string a template may render (the stores' record limit: a larger one cannot be saved)."""


def kind(value: object) -> str:
    """How an error message names the type of ``value`` ("a string", "an object", ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, Mapping):
        return "an object"
    return f"a {type(value).__name__}"


def too_large(size: int) -> TemplateError:
    """The error for a rendered value of ``size`` characters, over the cap."""
    return TemplateError(
        f"the rendered value is larger than {MAX_RENDERED_CHARS:,} characters ({size:,}); "
        "render an id or a part of it, not a whole document (chained tojson doubles a string)"
    )


def to_json(value: Any) -> str:
    """Compact JSON of ``value`` (the ``tojson`` filter); TemplateError if over the cap."""
    if type(value) is str and len(value) > MAX_RENDERED_CHARS // 2:
        # JSON escaping can multiply a string (6x for control characters): refuse before, not
        # after, building the result.
        bound = len(value) + 2 + sum(value.count(c) for c in '"\\')
        if bound > MAX_RENDERED_CHARS:
            raise too_large(bound)
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise TemplateError(f"cannot render {kind(value)} as JSON: {exc}") from None
    if len(text) > MAX_RENDERED_CHARS:
        raise too_large(len(text))
    return text


def _to_text(value: Any) -> str:
    if type(value) is str:
        return value
    return to_json(value)


def _length(value: Any) -> int:
    if isinstance(value, str | list | tuple | Mapping):
        return len(value)
    raise TemplateError(f"length needs a string, list or object, got {kind(value)}")


FILTERS: Final[dict[str, Callable[[Any], Any]]] = {
    "tojson": to_json,
    "string": _to_text,
    "lower": lambda v: _to_text(v).lower(),
    "upper": lambda v: _to_text(v).upper(),
    "trim": lambda v: _to_text(v).strip(),
    "length": _length,
}
"""The filters by name (``default(...)`` takes an argument and is handled by the evaluator)."""
FILTER_NAMES: Final = ", ".join([*FILTERS, "default(...)"])

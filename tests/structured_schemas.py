"""Twenty JSON Schemas of growing complexity, shared by the constrained-decoding tests of every
engine: flat objects, enums, optional fields, arrays, nested objects, anyOf, arrays of objects.

Strings and arrays are bounded so that even a random-weights model (the torch tests) must finish
a value within the token budget; :func:`bounded` also bounds integers for it (llama.cpp's grammar
converter ignores ``minimum``/``maximum``, so the shared schemas leave integers open). Every
answer is checked against its schema with ``jsonschema``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SCHEMAS", "bounded", "prompt_for"]

_NAME: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": 16}
_SMALL_INT: dict[str, Any] = {"type": "integer"}
_STATUS: dict[str, Any] = {"enum": ["pending", "shipped", "delivered", "cancelled"]}


def _obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": list(props) if required is None else required,
        "additionalProperties": False,
    }


SCHEMAS: list[tuple[str, dict[str, Any]]] = [
    ("one_string", _obj({"name": _NAME})),
    ("one_integer", _obj({"count": _SMALL_INT})),
    ("one_boolean", _obj({"ok": {"type": "boolean"}})),
    ("enum", _obj({"status": _STATUS})),
    ("two_fields", _obj({"name": _NAME, "age": _SMALL_INT})),
    ("const_and_enum", _obj({"kind": {"const": "order"}, "status": _STATUS})),
    ("optional_field", _obj({"name": _NAME, "nickname": _NAME}, required=["name"])),
    ("all_optional", _obj({"a": {"type": "boolean"}, "b": _SMALL_INT}, required=[])),
    ("array_of_ints", _obj({"ids": {"type": "array", "items": _SMALL_INT, "maxItems": 3}})),
    (
        "array_of_enums",
        _obj({"tags": {"type": "array", "items": _STATUS, "minItems": 1, "maxItems": 2}}),
    ),
    ("nested_object", _obj({"customer": _obj({"name": _NAME, "vip": {"type": "boolean"}})})),
    (
        "nested_optional",
        _obj({"order": _obj({"id": _SMALL_INT, "note": _NAME}, required=["id"])}),
    ),
    ("nullable", _obj({"eta": {"anyOf": [_NAME, {"type": "null"}]}})),
    ("any_of_types", _obj({"value": {"anyOf": [_SMALL_INT, {"type": "boolean"}]}})),
    (
        "array_of_objects",
        _obj({"items": {"type": "array", "items": _obj({"sku": _NAME}), "maxItems": 2}}),
    ),
    (
        "intent",
        _obj(
            {
                "intent": {"enum": ["order_status", "refund", "other"]},
                "order_id": {
                    "anyOf": [{"type": "string", "pattern": "^[0-9]{4}$"}, {"type": "null"}]
                },
            }
        ),
    ),
    (
        "tool_call",
        _obj({"name": {"const": "lookup_order"}, "arguments": _obj({"order_id": _SMALL_INT})}),
    ),
    (
        "two_levels",
        _obj(
            {
                "order": _obj(
                    {"status": _STATUS, "shipping": _obj({"carrier": _NAME, "days": _SMALL_INT})}
                )
            }
        ),
    ),
    (
        "mixed",
        _obj(
            {
                "id": _SMALL_INT,
                "status": _STATUS,
                "tags": {"type": "array", "items": _NAME, "maxItems": 2},
                "refund": {"anyOf": [_obj({"amount": _SMALL_INT}), {"type": "null"}]},
            },
            required=["id", "status", "tags"],
        ),
    ),
    (
        "deep",
        _obj(
            {
                "a": _obj(
                    {
                        "b": _obj(
                            {
                                "c": {
                                    "type": "array",
                                    "items": _obj({"d": _STATUS}),
                                    "maxItems": 2,
                                },
                                "e": {"type": "boolean"},
                            },
                            required=["c"],
                        )
                    }
                ),
                "f": _NAME,
            }
        ),
    ),
]
"""(name, schema), simplest first."""


def prompt_for(name: str) -> str:
    """A user message asking for the schema's kind of answer (the constraint does the rest)."""
    return f"Order 1042 shipped with UPS, 2 items, customer Ada. Answer as JSON ({name.replace('_', ' ')})."


def bounded(schema: Any) -> Any:
    """``schema`` with every integer limited to 0..999 (a random model would never stop)."""
    if isinstance(schema, list):
        return [bounded(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: bounded(value) for key, value in schema.items()}
    if out.get("type") == "integer":
        out.update(minimum=0, maximum=999)
    return out

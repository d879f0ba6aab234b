"""Conditions inside ``{{ }}``: comparisons, ``in``, ``and``/``or``/``not`` and parentheses.

Grammar (on top of :mod:`._template`'s paths, literals and filters; ``unary`` is a path or a
literal with its filters)::

    cond  := or
    or    := and ('or' and)*
    and   := not ('and' not)*
    not   := 'not' not | cmp
    cmp   := atom (('==' | '!=' | '<' | '<=' | '>' | '>=' | 'in' | 'not' 'in') atom)?
    atom  := '(' cond ')' | '[' (literal (',' literal)*)? ']' | unary

Evaluation stays in the sandbox: an operand is a path of the scope or a literal, so there is no
call and no attribute access. Values are JSON values: truthiness is JSON's (``null``, ``false``,
``0``, ``""``, ``[]``, ``{}`` are false), ``==`` never equates ``true`` with ``1``, ordering
compares two numbers or two strings (and is false when either side is ``null``, e.g. a model
with no latency figures yet), ``in`` looks in a list, a string or an object's keys. ``and``,
``or`` and ``not`` give ``true`` or ``false``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

from .._errors import TemplateError
from ._filters import kind

__all__ = ["Condition", "ListLiteral", "json_equal", "parse_condition", "truthy"]

MAX_NESTING: Final = 32
"""Parentheses and ``not`` may nest this deep in one expression."""

_WORD: Final = re.compile(r"[^\W\d]\w*")
_SYMBOLS: Final = ("==", "!=", "<=", ">=", "<", ">")


class _Operand(Protocol):
    text: str

    def evaluate(self, scope: Mapping[str, Any]) -> Any: ...

    def refs(self) -> list[tuple[str | int, ...]]: ...


class _Reader(Protocol):
    """What this grammar needs of the template parser (``chainrt.spec._template._Parser``)."""

    text: str
    pos: int

    def skip_space(self) -> None: ...

    def peek(self) -> str: ...

    def fail(self, problem: str, pos: int | None = None) -> TemplateError: ...

    def unary(self) -> Any: ...

    def literal(self) -> Any: ...


def truthy(value: Any) -> bool:
    """JSON truthiness: ``null``, ``false``, ``0``, ``""``, ``[]`` and ``{}`` are false."""
    return bool(value)


def json_equal(left: Any, right: Any) -> bool:
    """Equality of JSON values: ``true`` is not ``1`` (as it is in Python)."""
    if isinstance(left, bool) is not isinstance(right, bool):
        return False
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(map(json_equal, left, right))
    return bool(left == right)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _order(op: str, left: Any, right: Any) -> bool:
    if left is None or right is None:
        return False
    if not (_number(left) and _number(right)) and not (
        isinstance(left, str) and isinstance(right, str)
    ):
        raise TemplateError(f"cannot compare {kind(left)} {op} {kind(right)}")
    if op == "<":
        return bool(left < right)
    if op == "<=":
        return bool(left <= right)
    if op == ">":
        return bool(left > right)
    return bool(left >= right)


def _contains(left: Any, right: Any) -> bool:
    if isinstance(right, list):
        return any(json_equal(left, item) for item in right)
    if isinstance(right, str):
        if not isinstance(left, str):
            raise TemplateError(f"'in' a string needs a string, got {kind(left)}")
        return left in right
    if isinstance(right, Mapping):
        return isinstance(left, str) and left in right
    raise TemplateError(f"'in' needs a list, a string or an object on its right, got {kind(right)}")


_COMPARE: Final[dict[str, Callable[[Any, Any], bool]]] = {
    "==": json_equal,
    "!=": lambda a, b: not json_equal(a, b),
    "in": _contains,
    "not in": lambda a, b: not _contains(a, b),
}


class Condition:
    """One operator applied to operands (``and``/``or``: any number; ``not``: one; else two)."""

    __slots__ = ("op", "operands", "text")

    def __init__(self, op: str, operands: list[Any], text: str = "") -> None:
        self.op = op
        self.operands = tuple(operands)
        self.text = text

    def refs(self) -> list[tuple[str | int, ...]]:
        """The scope paths its operands read."""
        out: list[tuple[str | int, ...]] = []
        for operand in self.operands:
            out.extend(operand.refs())
        return out

    def evaluate(self, scope: Mapping[str, Any]) -> Any:
        """Its value against ``scope`` (TemplateError for a missing path or a bad comparison)."""
        op = self.op
        if op == "or":
            return any(truthy(o.evaluate(scope)) for o in self.operands)
        if op == "and":
            return all(truthy(o.evaluate(scope)) for o in self.operands)
        if op == "not":
            return not truthy(self.operands[0].evaluate(scope))
        left = self.operands[0].evaluate(scope)
        right = self.operands[1].evaluate(scope)
        compare = _COMPARE.get(op)
        try:
            if compare is not None:
                return compare(left, right)
            return _order(op, left, right)
        except TemplateError as exc:
            shown = self.text if len(self.text) <= 80 else self.text[:77] + "..."
            raise TemplateError(f"{{{{ {shown} }}}}: {exc.message}") from None


class ListLiteral:
    """A list written in an expression (``x in ["refund", "return"]``)."""

    __slots__ = ("text", "value")

    def __init__(self, value: list[Any], text: str) -> None:
        self.value = value
        self.text = text

    def refs(self) -> list[tuple[str | int, ...]]:
        """A literal reads nothing."""
        return []

    def evaluate(self, scope: Mapping[str, Any]) -> Any:
        """A copy of the list (a caller may keep it)."""
        return list(self.value)


_MAX_LIST: Final = 256


def _list(reader: _Reader) -> ListLiteral:
    at = reader.pos
    reader.pos += 1
    items: list[Any] = []
    reader.skip_space()
    while reader.peek() != "]":
        if items:
            if reader.peek() != ",":
                raise reader.fail("expected ',' or ']'")
            reader.pos += 1
            reader.skip_space()
        items.append(reader.literal())
        if len(items) > _MAX_LIST:
            raise reader.fail(f"a list of more than {_MAX_LIST} items", at)
        reader.skip_space()
        if not reader.peek():
            raise reader.fail("'[' is never closed", at)
    reader.pos += 1
    return ListLiteral(items, reader.text[at : reader.pos])


def _keyword(reader: _Reader, word: str) -> bool:
    """True (and past it) when the next token is the keyword ``word``."""
    reader.skip_space()
    match = _WORD.match(reader.text, reader.pos)
    if match is None or match.group() != word:
        return False
    reader.pos = match.end()
    return True


def _peek_word(reader: _Reader) -> str | None:
    match = _WORD.match(reader.text, reader.pos)
    return None if match is None else match.group()


def parse_condition(reader: _Reader, depth: int = 0) -> Any:
    """Parse ``cond`` at the reader's position; the operand itself when there is no operator."""
    if depth > MAX_NESTING:
        raise reader.fail(f"an expression nested deeper than {MAX_NESTING}")
    begin = reader.pos
    items = [_and(reader, depth)]
    while _keyword(reader, "or"):
        items.append(_and(reader, depth))
    return items[0] if len(items) == 1 else _made("or", items, reader, begin)


def _made(op: str, items: list[Any], reader: _Reader, begin: int) -> Condition:
    return Condition(op, items, reader.text[begin : reader.pos].strip())


def _and(reader: _Reader, depth: int) -> Any:
    begin = reader.pos
    items = [_not(reader, depth)]
    while _keyword(reader, "and"):
        items.append(_not(reader, depth))
    return items[0] if len(items) == 1 else _made("and", items, reader, begin)


def _not(reader: _Reader, depth: int) -> Any:
    reader.skip_space()
    begin = reader.pos
    if _peek_word(reader) == "not":
        reader.pos += 3
        if depth + 1 > MAX_NESTING:
            raise reader.fail(f"an expression nested deeper than {MAX_NESTING}")
        return _made("not", [_not(reader, depth + 1)], reader, begin)
    return _compare(reader, depth)


def _operator(reader: _Reader) -> str | None:
    reader.skip_space()
    text, pos = reader.text, reader.pos
    for symbol in _SYMBOLS:
        if text.startswith(symbol, pos):
            reader.pos = pos + len(symbol)
            return symbol
    word = _peek_word(reader)
    if word == "in":
        reader.pos = pos + 2
        return "in"
    if word == "not":
        reader.pos = pos + 3
        if _keyword(reader, "in"):
            return "not in"
        raise reader.fail("expected 'in' after 'not'")
    return None


def _compare(reader: _Reader, depth: int) -> Any:
    reader.skip_space()
    begin = reader.pos
    left = _atom(reader, depth)
    op = _operator(reader)
    if op is None:
        return left
    right = _atom(reader, depth)
    return _made(op, [left, right], reader, begin)


def _atom(reader: _Reader, depth: int) -> Any:
    reader.skip_space()
    if reader.peek() == "(":
        at = reader.pos
        reader.pos += 1
        inner = parse_condition(reader, depth + 1)
        reader.skip_space()
        if reader.peek() != ")":
            raise reader.fail("'(' is never closed", at)
        reader.pos += 1
        return inner
    if reader.peek() == "[":
        return _list(reader)
    return reader.unary()

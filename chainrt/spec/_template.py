"""The ``{{ ... }}`` template language of chain files: small, sandboxed, parsed once.

Grammar (whitespace is allowed around an expression and around ``|``)::

    template := (text | '{{' expr '}}')*
    expr     := cond              (comparisons, in, and/or/not, parentheses: see ._expr)
    unary    := primary ('|' filter)*
    primary  := path | literal
    path     := IDENT ('.' IDENT | '[' INT ']' | '[' STRING ']')*
    filter   := 'tojson' | 'lower' | 'upper' | 'trim' | 'length' | 'string'
              | 'default' '(' literal ')'
    literal  := STRING | INT | FLOAT | 'true' | 'false' | 'null'

A literal primary (``{{ "{{" }}``) is how a prompt writes a literal ``{{``.

Names resolve only through dict keys and list indexes of the scope: there is no attribute access,
no call, no import, so ``{{ input.__class__ }}`` is simply a key that does not exist. The scope a
runner passes holds ``input``, ``steps`` (``steps.<id>.output``), ``run_id`` and, in step fields,
``step`` (``id``, ``model``, ``weight``).

A string that is exactly one ``{{ expr }}`` (surrounding whitespace allowed) renders to the
expression's value with its type; any other string renders to a string in which strings are
inserted as-is and every other value as compact JSON.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import re
from collections.abc import Iterator, Mapping
from typing import Any, Final

from .._errors import TemplateError
from ._expr import parse_condition
from ._filters import FILTER_NAMES, FILTERS, MAX_RENDERED_CHARS, kind, to_json, too_large

__all__ = [
    "MAX_RENDERED_CHARS",
    "MAX_TEMPLATE_CHARS",
    "Template",
    "compile_template",
    "format_path",
    "iter_templates",
    "render_value",
]

MAX_TEMPLATE_CHARS: Final = 1_000_000
"""Longest template accepted (a chain file is at most 1 MiB anyway)."""

_MAX_PATH_PARTS: Final = 64
_MAX_FILTERS: Final = 16
_MAX_KEYS_SHOWN: Final = 20

# Scanner tokens. Each is linear: no nested quantifiers, disjoint alternatives.
_NAME: Final = re.compile(r"[^\W\d]\w*")
_NUMBER: Final = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)
_INTEGER: Final = re.compile(r"[+-]?\d+", re.ASCII)
_STRINGS: Final = {q: re.compile(rf"{q}((?:[^{q}\\]|\\.)*){q}", re.DOTALL) for q in "'\""}
_ESCAPE: Final = re.compile(r"\\(u[0-9a-fA-F]{4}|.)", re.DOTALL)
_ESCAPES: Final = {"\\": "\\", '"': '"', "'": "'", "n": "\n", "t": "\t", "r": "\r", "/": "/"}

PathKey = str | int
"""One step of a path: a dict key or a list index."""


class _Missing:
    """Why a path did not resolve; built only on failure so the hot path allocates nothing."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


# --------------------------------------------------------------------------------------- paths


def format_path(path: tuple[PathKey, ...]) -> str:
    """Write a path as a template would: ``steps.intent.output["order id"][0]``."""
    out: list[str] = []
    for key in path:
        if isinstance(key, int):
            out.append(f"[{key}]")
        elif key.isidentifier() and key.isascii():
            out.append(f".{key}" if out else key)
        else:
            out.append(f"[{json.dumps(key, ensure_ascii=False)}]")
    return "".join(out)


def _describe_keys(mapping: Mapping[Any, Any]) -> str:
    if not mapping:
        return "it is empty"
    names = [str(k)[:40] for k in itertools.islice(mapping, _MAX_KEYS_SHOWN)]
    more = ", ..." if len(mapping) > _MAX_KEYS_SHOWN else ""
    return "it has: " + ", ".join(names) + more


def _resolve(path: tuple[PathKey, ...], scope: Mapping[str, Any]) -> Any:
    """Follow ``path`` through dict keys and list indexes; a ``_Missing`` if it breaks."""
    current: Any = scope
    for depth, key in enumerate(path):
        if type(key) is str:
            if isinstance(current, Mapping):
                # .get() and not [] so a defaultdict in the scope cannot grow a key.
                found = current.get(key, _Missing)
                if found is not _Missing:
                    current = found
                    continue
                if depth == 0:
                    names = ", ".join(sorted(str(k) for k in current)) or "nothing"
                    return _Missing(f"name {key!r} is not defined (templates here see: {names})")
                where = format_path(path[:depth])
                return _Missing(f"{where} has no key {key!r} ({_describe_keys(current)})")
        elif isinstance(current, list | tuple) and not isinstance(key, str):
            try:
                current = current[key]
                continue
            except IndexError:
                where = format_path(path[:depth])
                return _Missing(f"index {key} is out of range: {where} has {len(current)} items")
        where = format_path(path[:depth])
        wanted = f"key {key!r}" if type(key) is str else f"index [{key}]"
        return _Missing(f"{where} is {kind(current)}, so it has no {wanted}")
    return current


class _Expr:
    """One parsed ``{{ ... }}``: a path (or a literal) and its filters."""

    __slots__ = ("filters", "literal", "path", "text")

    def __init__(
        self,
        text: str,
        path: tuple[PathKey, ...] | None,
        literal: Any,
        filters: list[tuple[str, Any]],
    ) -> None:
        self.text = text
        self.path = path
        self.literal = literal
        self.filters = tuple(filters)

    def refs(self) -> list[tuple[PathKey, ...]]:
        """The scope path it reads (none for a literal)."""
        return [] if self.path is None else [self.path]

    def evaluate(self, scope: Mapping[str, Any]) -> Any:
        value = self.literal if self.path is None else _resolve(self.path, scope)
        for name, arg in self.filters:
            if name == "default":
                if value is None or isinstance(value, _Missing):
                    value = arg
            elif isinstance(value, _Missing):
                continue  # a later default(...) may still supply a value
            else:
                value = FILTERS[name](value)
        if isinstance(value, _Missing):
            shown = self.text if len(self.text) <= 80 else self.text[:77] + "..."
            raise TemplateError(f"{{{{ {shown} }}}}: {value.reason}")
        return value


# ------------------------------------------------------------------------------------- parser


def _where(text: str, pos: int) -> str:
    line = text.count("\n", 0, pos) + 1
    column = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return f"line {line}, column {column}" if line > 1 else f"column {column}"


class _Parser:
    """A hand-written scanner: linear time, no recursion."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, problem: str, pos: int | None = None) -> TemplateError:
        at = self.pos if pos is None else pos
        shown = self.text if len(self.text) <= 60 else self.text[:57] + "..."
        return TemplateError(f"bad template {shown!r}: {problem} at {_where(self.text, at)}")

    def parse(self) -> list[Any]:
        text = self.text
        parts: list[Any] = []
        while True:
            start = text.find("{{", self.pos)
            if start < 0:
                if self.pos < len(text):
                    parts.append(text[self.pos :])
                return parts
            if start > self.pos:
                parts.append(text[self.pos : start])
            self.pos = start + 2
            parts.append(self.expression(start))

    def skip_space(self) -> None:
        text, pos = self.text, self.pos
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        self.pos = pos

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def expression(self, opened_at: int) -> Any:
        self.skip_space()
        begin = self.pos
        if self.pos >= len(self.text):
            raise self.fail("'{{' is never closed", opened_at)
        node = parse_condition(self)
        self.skip_space()
        if not self.text.startswith("}}", self.pos):
            if self.pos >= len(self.text):
                raise self.fail("'{{' is never closed", opened_at)
            raise self.fail(f"unexpected {self.peek()!r}")
        if not isinstance(node, _Expr):
            node.text = self.text[begin : self.pos].strip()
        self.pos += 2
        return node

    def unary(self) -> _Expr:
        """A path or a literal, and its filters."""
        begin = self.pos
        path: tuple[PathKey, ...] | None = None
        literal: Any = None
        char = self.peek()
        if _NAME.match(char):
            name = self.identifier()
            if name in ("true", "false", "null"):
                literal = {"true": True, "false": False, "null": None}[name]
            else:
                path = self.path_rest(name)
        elif char and not self.text.startswith("}}", self.pos):
            literal = self.literal()
        else:
            found = "the end" if not char else repr(char)
            raise self.fail(f"expected a name or a literal, found {found}")
        filters: list[tuple[str, Any]] = []
        end = self.pos
        while True:
            self.skip_space()
            if self.peek() != "|":
                break
            self.pos += 1
            self.skip_space()
            filters.append(self.filter())
            if len(filters) > _MAX_FILTERS:
                raise self.fail(f"more than {_MAX_FILTERS} filters")
            end = self.pos
        self.pos = end
        return _Expr(self.text[begin:end].strip(), path, literal, filters)

    def identifier(self) -> str:
        match = _NAME.match(self.text, self.pos)
        if match is None:
            raise self.fail("expected a name")
        self.pos = match.end()
        return match.group()

    def path_rest(self, root: str) -> tuple[PathKey, ...]:
        parts: list[PathKey] = [root]
        while True:
            char = self.peek()
            if char == ".":
                self.pos += 1
                parts.append(self.identifier())
            elif char == "[":
                self.pos += 1
                self.skip_space()
                at = self.pos
                key = self.literal()
                if isinstance(key, bool) or not isinstance(key, str | int):
                    raise self.fail("an index must be an integer or a quoted key", at)
                parts.append(key)
                self.skip_space()
                if self.peek() != "]":
                    raise self.fail("expected ']'")
                self.pos += 1
            else:
                return tuple(parts)
            if len(parts) > _MAX_PATH_PARTS:
                raise self.fail(f"a path longer than {_MAX_PATH_PARTS} parts")

    def filter(self) -> tuple[str, Any]:
        at = self.pos
        name = self.identifier()
        if name == "default":
            self.skip_space()
            if self.peek() != "(":
                raise self.fail("default needs a value: default(...)")
            self.pos += 1
            self.skip_space()
            arg = self.literal()
            self.skip_space()
            if self.peek() != ")":
                raise self.fail("expected ')'")
            self.pos += 1
            return name, arg
        if name not in FILTERS:
            raise self.fail(f"unknown filter {name!r} (filters: {FILTER_NAMES})", at)
        return name, None

    def literal(self) -> Any:
        char = self.peek()
        if char in ("'", '"'):
            return self.string(char)
        if _NAME.match(char):
            at = self.pos
            word = self.identifier()
            if word in ("true", "false", "null"):
                return {"true": True, "false": False, "null": None}[word]
            raise self.fail(f"expected a literal, found name {word!r}", at)
        return self.number()

    def number(self) -> int | float:
        start = self.pos
        match = _NUMBER.match(self.text, start)
        if match is None:
            found = repr(self.text[start]) if start < len(self.text) else "the end"
            raise self.fail(f"expected a name or a literal, found {found}")
        token, end = match.group(), match.end()
        if len(token) > 64:  # int() of thousands of digits is slow, and refused past 4300
            raise self.fail("a number longer than 64 characters", start)
        if end < len(self.text) and (self.text[end].isalnum() or self.text[end] in "._"):
            raise self.fail(f"bad number {self.text[start : end + 1][:30]!r}", start)
        self.pos = end
        if _INTEGER.fullmatch(token):
            return int(token)
        value = float(token)
        if not math.isfinite(value):
            raise self.fail(f"number {token[:30]!r} is not finite", start)
        return value

    def string(self, quote: str) -> str:
        match = _STRINGS[quote].match(self.text, self.pos)
        if match is None:
            raise self.fail("unterminated string")
        body_at = self.pos + 1
        self.pos = match.end()

        def unescape(esc: re.Match[str]) -> str:
            code = esc.group(1)
            if len(code) == 5:
                return chr(int(code[1:], 16))
            if code in _ESCAPES:
                return _ESCAPES[code]
            raise self.fail("bad escape in string", body_at + esc.start())

        return _ESCAPE.sub(unescape, match.group(1)) if "\\" in match.group(1) else match.group(1)


# ----------------------------------------------------------------------------------- template


class Template:
    """A parsed template: build with :func:`compile_template`, then :meth:`render` it often."""

    __slots__ = ("_native", "_parts", "source")

    def __init__(self, source: str) -> None:
        if len(source) > MAX_TEMPLATE_CHARS:
            raise TemplateError(f"template is longer than {MAX_TEMPLATE_CHARS} characters")
        self.source = source
        """The template text as written."""
        self._parts = tuple(_Parser(source).parse())
        exprs = [p for p in self._parts if not isinstance(p, str)]
        texts = [p for p in self._parts if isinstance(p, str)]
        only_one = len(exprs) == 1 and all(not t.strip() for t in texts)
        self._native: Any = exprs[0] if only_one else None

    @property
    def references(self) -> list[tuple[PathKey, ...]]:
        """The scope paths this template reads, in order (literals read nothing)."""
        return [ref for p in self._parts if not isinstance(p, str) for ref in p.refs()]

    @property
    def expressions(self) -> list[Any]:
        """Its parsed ``{{ }}`` expressions (paths, literals, conditions), for checks at load."""
        return [p for p in self._parts if not isinstance(p, str)]

    @property
    def is_native(self) -> bool:
        """True when the template is one ``{{ expr }}`` and renders to the value's own type."""
        return self._native is not None

    def render(self, scope: Mapping[str, Any]) -> Any:
        """Render against ``scope``; :class:`TemplateError` names any missing path."""
        if self._native is not None:
            return self._native.evaluate(scope)
        out: list[str] = []
        size = 0
        for part in self._parts:
            if type(part) is str:
                out.append(part)
            else:
                value = part.evaluate(scope)
                out.append(value if type(value) is str else to_json(value))
            size += len(out[-1])
            if size > MAX_RENDERED_CHARS:
                raise too_large(size)
        return "".join(out)

    def __repr__(self) -> str:
        return f"Template({self.source!r})"


_CACHE_MAX_CHARS: Final = 16_384


@functools.lru_cache(maxsize=2048)
def _compile_cached(text: str) -> Template:
    return Template(text)


def compile_template(text: str) -> Template:
    """Parse ``text`` once (cached); :class:`TemplateError` with the position if it is malformed."""
    if type(text) is not str:
        raise TemplateError(f"a template must be a string, got {type(text).__name__}")
    if len(text) > _CACHE_MAX_CHARS:
        # Huge texts are parsed each time (linear) rather than pinned in memory by the cache.
        return Template(text)
    return _compile_cached(text)


def render_value(value: Any, scope: Mapping[str, Any]) -> Any:
    """Render every string inside ``value`` (dicts and lists are walked; keys are kept as-is)."""
    if type(value) is str:
        return compile_template(value).render(scope) if "{{" in value else value
    if isinstance(value, Mapping):
        return {key: render_value(item, scope) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [render_value(item, scope) for item in value]
    return value


def walk_strings(
    value: Any, path: tuple[PathKey, ...] = ()
) -> Iterator[tuple[tuple[PathKey, ...], str]]:
    """Yield ``(path, string)`` for every string inside ``value`` that contains ``{{``."""
    if isinstance(value, str):
        if "{{" in value:
            yield path, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from walk_strings(item, (*path, str(key)))
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from walk_strings(item, (*path, index))


def iter_templates(value: Any) -> Iterator[tuple[str, Template]]:
    """Yield ``(sub-path, template)`` for every template inside ``value``, e.g. ``("a[0].b", t)``.

    The sub-path of a bare string is ``""``. A malformed template raises :class:`TemplateError`
    whose message starts with its sub-path.
    """
    for path, text in walk_strings(value):
        where = format_path(path)
        try:
            template = compile_template(text)
        except TemplateError as exc:
            if not where:
                raise
            raise TemplateError(f"{where}: {exc.message}") from None
        yield where, template

"""Read a YAML file into plain Python values, remembering the line of every key and item.

PyYAML's safe loader composes the node tree; the values are then built here so that each
``path -> line`` is recorded (``("steps", 1, "llm", "model") -> 14``) and so that the parts of YAML
a chain file has no use for are refused rather than silently accepted: duplicate keys, non-string
keys, anchors and aliases (no "billion laughs"), merge keys, custom tags, non-finite numbers,
deep nesting, huge files, several documents. Every failure is a :class:`SpecError` with
``file:line``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Final

import yaml
from yaml.events import Event
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.reader import ReaderError

from .._errors import SpecError
from .._files import FileRefused, read_bounded
from ._template import format_path

__all__ = ["MAX_DEPTH", "MAX_FILE_BYTES", "LinePath", "YamlDocument", "parse_yaml", "read_yaml"]

MAX_FILE_BYTES: Final = 1024 * 1024
"""Largest chain file accepted (1 MiB)."""

MAX_DEPTH: Final = 64
"""Deepest nesting of mappings and lists accepted."""

LinePath = tuple[str | int, ...]
"""Where a value sits in the document: mapping keys and list indexes from the top."""

_TAG = "tag:yaml.org,2002:"
_SCALAR_TAGS: Final = frozenset(_TAG + t for t in ("null", "bool", "int", "float", "str"))


@dataclass(frozen=True)
class YamlDocument:
    """A parsed YAML mapping and the 1-based line of every key / list item in it."""

    data: dict[str, Any]
    lines: dict[LinePath, int] = field(default_factory=dict)

    def line(self, path: LinePath) -> int | None:
        """Line of ``path``, or of its nearest parent that has one (``None`` if nothing does)."""
        for end in range(len(path), -1, -1):
            found = self.lines.get(path[:end])
            if found is not None:
                return found
        return None


class _Refused(Exception):
    """Something this loader refuses on purpose; carries the 0-based line it was found on."""

    def __init__(self, message: str, line0: int, path: LinePath | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line0 = line0
        self.path = path  # where in the document, when known (composing knows no paths)


class _Loader(yaml.SafeLoader):
    """The safe loader, refusing anchors, aliases and deep nesting while it composes."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0
        self.last_line0 = 0

    def next_event(self) -> tuple[Event, int]:
        """The next parser event and its 0-based line."""
        event: Event = self.peek_event()  # type: ignore[no-untyped-call]
        return event, event.start_mark.line if event.start_mark is not None else 0

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        event, line0 = self.next_event()
        self.last_line0 = line0
        if isinstance(event, yaml.AliasEvent):
            raise _Refused(
                f"aliases (*{event.anchor}) are not supported in chain files; write the value out",
                line0,
            )
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            raise _Refused(
                f"anchors (&{anchor}) are not supported in chain files; write the value out",
                line0,
            )
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise _Refused(f"nesting deeper than {MAX_DEPTH} levels", line0)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _tag(tag: str) -> str:
    return "!!" + tag[len(_TAG) :] if tag.startswith(_TAG) else tag


def _scalar(loader: _Loader, node: ScalarNode) -> Any:
    tag = node.tag
    if tag == _TAG + "timestamp":
        # Kept as written: a chain is JSON data and a date has no JSON form.
        return node.value
    if tag not in _SCALAR_TAGS:
        raise _Refused(
            f"YAML tag {_tag(tag)!r} is not supported in chain files", node.start_mark.line
        )
    value = loader.construct_object(node)
    if isinstance(value, float) and not math.isfinite(value):
        raise _Refused(
            f"{node.value!r}: infinite and NaN numbers are not supported", node.start_mark.line
        )
    return value


def _key(loader: _Loader, node: Node) -> str:
    if not isinstance(node, ScalarNode):
        raise _Refused("mapping keys must be plain strings", node.start_mark.line)
    if node.tag == _TAG + "merge":
        raise _Refused("merge keys (<<) are not supported in chain files", node.start_mark.line)
    key = _scalar(loader, node)
    if not isinstance(key, str):
        raise _Refused(
            f"mapping keys must be strings, but {node.value!r} reads as "
            f"{type(key).__name__ if key is not None else 'null'}; quote it",
            node.start_mark.line,
        )
    return key


def _build(loader: _Loader, node: Node, path: LinePath, lines: dict[LinePath, int]) -> Any:
    try:
        return _build_node(loader, node, path, lines)
    except _Refused as exc:
        if exc.path is None:
            exc.path = path
        raise


def _build_node(loader: _Loader, node: Node, path: LinePath, lines: dict[LinePath, int]) -> Any:
    if isinstance(node, ScalarNode):
        return _scalar(loader, node)
    if isinstance(node, SequenceNode):
        if node.tag != _TAG + "seq":
            raise _Refused(
                f"YAML tag {_tag(node.tag)!r} is not supported in chain files", node.start_mark.line
            )
        items: list[Any] = []
        for index, item in enumerate(node.value):
            lines[(*path, index)] = item.start_mark.line + 1
            items.append(_build(loader, item, (*path, index), lines))
        return items
    if isinstance(node, MappingNode):
        if node.tag != _TAG + "map":
            raise _Refused(
                f"YAML tag {_tag(node.tag)!r} is not supported in chain files", node.start_mark.line
            )
        mapping: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = _key(loader, key_node)
            here = (*path, key)
            if key in mapping:
                raise _Refused(
                    f"duplicate key {key!r} (first at line {lines[here]})",
                    key_node.start_mark.line,
                    here,
                )
            lines[here] = key_node.start_mark.line + 1
            mapping[key] = _build(loader, value_node, here, lines)
        return mapping
    raise _Refused(f"unexpected YAML node {type(node).__name__}", node.start_mark.line)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _yaml_error_message(exc: yaml.MarkedYAMLError) -> str:
    problem = _one_line(exc.problem or "invalid YAML")
    if "'\\t'" in problem:
        problem += "; indent with spaces, YAML does not allow tabs there"
    context = f" ({_one_line(exc.context)})" if exc.context else ""
    return f"invalid YAML: {problem}{context}"


def parse_yaml(source: str | bytes, *, file: str | None = None) -> YamlDocument:
    """Parse one YAML document whose top level is a mapping; :class:`SpecError` otherwise."""
    if isinstance(source, bytes):
        if len(source) > MAX_FILE_BYTES:
            raise SpecError(f"file is larger than {MAX_FILE_BYTES} bytes", file=file)
        try:
            text = source.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            line = source.count(b"\n", 0, exc.start) + 1
            raise SpecError(
                f"file is not valid UTF-8 (byte {exc.start}: {exc.reason})", file=file, line=line
            ) from None
    else:
        text = source
        if len(text) > MAX_FILE_BYTES:
            raise SpecError(f"text is longer than {MAX_FILE_BYTES} characters", file=file)
    loader: _Loader | None = None
    try:
        loader = _Loader(text)  # checks for non-printable characters right away
        return _document(loader, file)
    except _Refused as exc:
        where = format_path(exc.path) if exc.path else None
        raise SpecError(exc.message, file=file, line=exc.line0 + 1, field=where) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at = mark.line + 1 if mark is not None else None
        raise SpecError(_yaml_error_message(exc), file=file, line=at) from None
    except ReaderError as exc:
        char = exc.character
        code = char if isinstance(char, int) else ord(char) if char else 0
        raise SpecError(
            f"character U+{code:04X} is not allowed in YAML (control characters are refused)",
            file=file,
            line=text.count("\n", 0, exc.position) + 1,
        ) from None
    except yaml.YAMLError as exc:
        raise SpecError(f"invalid YAML: {_one_line(str(exc))}", file=file) from None
    except (RecursionError, ValueError, OverflowError) as exc:
        # int() of a huge number, or a nesting PyYAML's own code could not take.
        problem = "nesting too deep" if isinstance(exc, RecursionError) else _one_line(str(exc))
        at = loader.last_line0 + 1 if loader is not None else None
        raise SpecError(f"cannot read this YAML: {problem}", file=file, line=at) from None
    finally:
        if loader is not None:
            loader.dispose()


def _document(loader: _Loader, file: str | None) -> YamlDocument:
    node = loader.get_node() if loader.check_node() else None
    if node is not None and loader.check_node():
        raise SpecError(
            "a chain file holds one YAML document; found a second one ('---')",
            file=file,
            line=loader.next_event()[1] + 1,
        )
    if node is None or (isinstance(node, ScalarNode) and node.tag == _TAG + "null"):
        raise SpecError("file is empty; a chain needs name, budget and steps", file=file)
    if not isinstance(node, MappingNode):
        kind = "a list" if isinstance(node, SequenceNode) else "a single value"
        raise SpecError(
            f"the top level must be a mapping (name: ..., steps: ...), not {kind}",
            file=file,
            line=node.start_mark.line + 1,
        )
    lines: dict[LinePath, int] = {(): node.start_mark.line + 1}
    data = _build(loader, node, (), lines)
    return YamlDocument(data, lines)


def read_yaml(path: str | os.PathLike[str]) -> YamlDocument:
    """Read and parse a YAML file (a regular file of at most :data:`MAX_FILE_BYTES`)."""
    name = os.fspath(path)
    try:
        raw = read_bounded(path, MAX_FILE_BYTES)
    except FileRefused as exc:
        what = str(exc).replace("is a directory, not a file", "is a directory, not a chain file")
        raise SpecError(what, file=name) from None
    return parse_yaml(raw, file=name)

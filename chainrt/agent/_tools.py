"""The tools of an agent step: what the model is shown of each, and its calls checked and made.

A tool is a function named ``file.py:function`` (or ``module:function``, allow-listed like any
tool) or a LangChain ``BaseTool`` object named the same way. A function's JSON Schema comes from
its signature: each parameter (``ctx`` aside) is a property typed by its annotation (pydantic
models included), required unless it has a default; its description comes from the docstring's
first paragraph, and each parameter's from an ``Args:`` section (``name: text``) or ``:param
name: text`` lines. A LangChain tool brings its own name, description and argument schema.

A call the model proposes is checked here before it runs: an unknown tool, or arguments that do
not validate, is a :class:`BadCall` whose message goes back to the model (the step goes on).
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from .._errors import ChainRTError
from ..spec import ChainSpec, ConcurrencyKeySpec, resolve_callable, resolve_object
from ..spec._agent import AgentToolSpec
from ..spec._flow_check import all_steps

__all__ = ["AgentTool", "BadCall", "check_call", "load_tool", "tool_schemas"]


class BadCall(ChainRTError):
    """A proposed call that cannot run (unknown tool, arguments that fail its schema); its
    message is fed back to the model."""


@dataclass(frozen=True, slots=True)
class AgentTool:
    """One tool as the agent loop uses it."""

    name: str
    description: str
    parameters: dict[str, Any]
    """The JSON Schema of its arguments (an object)."""
    fn: Callable[..., Any]
    """What a call runs: the function, or the LangChain tool's ``ainvoke`` (one dict argument)."""
    langchain: bool = False
    args_model: type[BaseModel] | None = None
    """Validates (and converts) the arguments of a call; None: checked by the JSON Schema only."""
    keys: list[ConcurrencyKeySpec] = field(default_factory=list)
    """Concurrency keys held while one call runs (templates see ``args``)."""
    approval: str | None = None
    """The signal each call waits for before it runs (chainrt/agent/_approvals.py), or None."""

    def openai(self) -> dict[str, Any]:
        """As an OpenAI ``tools`` entry."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


_ARGS_HEADER = re.compile(r"^\s*(Args|Arguments|Parameters)\s*:\s*$")
_ARG_LINE = re.compile(r"^\s+\*{0,2}(\w+)\*{0,2}\s*(?:\([^)]*\))?\s*:\s*(.+)$")
_PARAM_LINE = re.compile(r"^\s*:param\s+(?:\w+\s+)?(\w+)\s*:\s*(.+)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """(first paragraph, {parameter: description}) of a Google- or reST-style docstring."""
    if not doc:
        return "", {}
    text = inspect.cleandoc(doc)
    summary = " ".join(text.split("\n\n", 1)[0].split())
    params: dict[str, str] = {}
    in_args = False
    for line in text.splitlines():
        match = _PARAM_LINE.match(line)
        if match:
            params[match.group(1)] = match.group(2).strip()
            continue
        if _ARGS_HEADER.match(line):
            in_args = True
            continue
        if in_args:
            arg = _ARG_LINE.match("    " + line if not line.startswith(" ") else line)
            if arg and line.startswith((" ", "\t")):
                params[arg.group(1)] = arg.group(2).strip()
            elif line.strip() and not line.startswith((" ", "\t")):
                in_args = False
    if summary.startswith((":param", "Args:")):
        summary = ""
    return summary, params


def function_schema(
    fn: Callable[..., Any], name: str
) -> tuple[str, dict[str, Any], type[BaseModel]]:
    """(description, JSON Schema of the arguments, the pydantic model that checks them)."""
    summary, described = parse_docstring(inspect.getdoc(fn))
    try:
        signature = inspect.signature(fn)
        hints = _hints(fn)
    except (TypeError, ValueError, NameError) as exc:
        raise ChainRTError(f"tool {name!r}: cannot read its signature: {exc}") from None
    fields: dict[str, Any] = {}
    for param in signature.parameters.values():
        if param.name == "ctx":
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise ChainRTError(
                f"tool {name!r}: parameter {param.name!r} cannot be given by name; an agent's "
                "tool takes keyword arguments only"
            )
        annotation = hints.get(param.name, Any)
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (
            annotation,
            Field(default=default, description=described.get(param.name)),
        )
    try:
        model = create_model(f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
        schema = model.model_json_schema()
    except Exception as exc:  # an annotation pydantic cannot turn into a schema
        raise ChainRTError(f"tool {name!r}: no JSON Schema for its parameters: {exc}") from None
    schema = inline_refs(schema)
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        if isinstance(prop, dict):
            prop.pop("title", None)
    return summary or f"The {name} tool.", schema, model


def inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with its ``$defs`` written in place of each ``$ref`` (a tool's schema sits
    inside the turn's schema, where ``#/$defs/...`` would point elsewhere); a model that
    contains itself becomes a plain object there."""
    defs = schema.get("$defs", {})

    def walk(node: Any, seen: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [walk(item, seen) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            name = ref[len("#/$defs/") :]
            if name in seen or name not in defs:
                return {"type": "object"}
            extra = {k: v for k, v in node.items() if k != "$ref"}
            return {**walk(defs[name], (*seen, name)), **extra}
        return {k: walk(v, seen) for k, v in node.items() if k != "$defs"}

    inlined: dict[str, Any] = walk(schema, ())
    return inlined


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    target = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else type(fn).__call__
    return typing.get_type_hints(target)


def load_tool(entry: AgentToolSpec, chain_dir: Path, allowed_modules: tuple[str, ...]) -> AgentTool:
    """The tool ``entry`` names, resolved in ``chain_dir`` (ToolError/SpecError if it cannot be)."""
    obj = resolve_object(entry.tool, chain_dir=chain_dir, allowed_modules=allowed_modules)
    if _is_langchain_tool(obj):
        name = entry.name or str(obj.name)
        schema = dict(obj.tool_call_schema.model_json_schema())
        schema.pop("title", None)
        return AgentTool(
            name=name,
            description=entry.description or str(obj.description or f"The {name} tool."),
            parameters=schema,
            fn=obj.ainvoke,
            langchain=True,
            keys=list(entry.concurrency),
            approval=entry.approval,
        )
    fn = resolve_callable(entry.tool, chain_dir=chain_dir, allowed_modules=allowed_modules)
    name = entry.name or entry.tool.rsplit(":", 1)[-1]
    description, schema, model = function_schema(fn, name)
    return AgentTool(
        name=name,
        description=entry.description or description,
        parameters=schema,
        fn=_plain_results(fn),
        args_model=model,
        keys=list(entry.concurrency),
        approval=entry.approval,
    )


def _plain(value: Any) -> Any:
    """A pydantic model a tool returned, as JSON data (the model reads its result as JSON)."""
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


def _plain_results(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` returning :func:`_plain` values (its signature, ``ctx`` included, kept)."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_async(**kwargs: Any) -> Any:
            return _plain(await fn(**kwargs))

        return run_async

    @functools.wraps(fn)
    def run(**kwargs: Any) -> Any:
        return _plain(fn(**kwargs))

    return run


def _is_langchain_tool(obj: Any) -> bool:
    """Whether ``obj`` is a LangChain ``BaseTool``, without importing LangChain: no object can
    be one unless the module that defines the class is loaded already (importing it for a plain
    function took seconds of the first agent run's budget on a loaded machine)."""
    module = sys.modules.get(_BASE_TOOL_MODULE)
    base = getattr(module, "BaseTool", None)
    return isinstance(base, type) and isinstance(obj, base)


_BASE_TOOL_MODULE = "langchain_core.tools.base"
"""Where LangChain defines ``BaseTool`` (``langchain_core.tools`` re-exports it)."""


def check_call(tools: dict[str, AgentTool], name: Any, arguments: Any) -> dict[str, Any]:
    """The keyword arguments a proposed call runs with; :class:`BadCall` when it cannot run."""
    tool = tools.get(name) if isinstance(name, str) else None
    if tool is None:
        known = ", ".join(tools)
        raise BadCall(f"there is no tool {str(name)[:64]!r}; the tools are: {known}")
    if not isinstance(arguments, dict):
        raise BadCall(f"the arguments of {tool.name} must be a JSON object")
    if tool.args_model is None:
        return _json_schema_checked(tool, arguments)
    try:
        checked = tool.args_model.model_validate(arguments)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(arguments)'}: {e['msg']}"
            for e in exc.errors(include_url=False)[:5]
        )
        raise BadCall(f"the arguments of {tool.name} do not fit its schema: {problems}") from None
    return {key: getattr(checked, key) for key in type(checked).model_fields}


def _json_schema_checked(tool: AgentTool, arguments: dict[str, Any]) -> dict[str, Any]:
    from jsonschema import Draft202012Validator

    errors = list(Draft202012Validator(tool.parameters).iter_errors(arguments))[:5]
    if errors:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.absolute_path) or '(arguments)'}: {e.message}"
            for e in errors
        )
        raise BadCall(f"the arguments of {tool.name} do not fit its schema: {problems}")
    return arguments


def tool_schemas(
    spec: ChainSpec, chain_dir: Path, allowed_modules: tuple[str, ...] = ()
) -> dict[str, list[dict[str, Any]]]:
    """Every agent step's tools as OpenAI ``tools`` entries, by step id (``chainrt schema
    --tools``). Resolving a tool imports its file: this runs the chain's code."""
    return {
        step.id: [
            load_tool(entry, chain_dir, allowed_modules).openai() for entry in step.agent.tools
        ]
        for step in all_steps(spec)
        if step.agent is not None
    }

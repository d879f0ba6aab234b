"""The chain format: models, the YAML loader, the template language and tool references.

from chainrt.spec import load_spec, render_value
loaded = load_spec("chains/support_agent.yaml")     # SpecError names file:line: field
prompt = render_value(loaded.spec.steps[0].llm.prompt, {"input": {...}, "steps": {}})
"""

from __future__ import annotations

from ._imports import check_reference, parse_allowed_modules, resolve_callable, resolve_object
from ._loader import (
    LoadedSpec,
    chain_json_schema,
    load_spec,
    parse_spec,
    spec_from_dict,
    validate_paths,
)
from ._models import (
    INPUT_TYPES,
    ChainSpec,
    ConcurrencyKeySpec,
    DurationMs,
    LlmSpec,
    MessageSpec,
    RetrySpec,
    StepSpec,
)
from ._roots import add_chain_root, chain_roots
from ._template import Template, compile_template, iter_templates, render_value
from ._yaml import YamlDocument, parse_yaml, read_yaml

__all__ = [
    "INPUT_TYPES",
    "ChainSpec",
    "ConcurrencyKeySpec",
    "DurationMs",
    "LlmSpec",
    "LoadedSpec",
    "MessageSpec",
    "RetrySpec",
    "StepSpec",
    "Template",
    "YamlDocument",
    "add_chain_root",
    "chain_json_schema",
    "chain_roots",
    "check_reference",
    "compile_template",
    "iter_templates",
    "load_spec",
    "parse_allowed_modules",
    "parse_spec",
    "parse_yaml",
    "read_yaml",
    "render_value",
    "resolve_callable",
    "resolve_object",
    "spec_from_dict",
    "validate_paths",
]

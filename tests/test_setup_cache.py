"""Per-run set-up caches: the spec dump kept per spec object, chain roots resolved once."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest

from chainrt.spec import ChainSpec, _dump, _roots, spec_from_dict
from chainrt.spec._dump import spec_dump


def _spec(name: str = "cached") -> ChainSpec:
    return spec_from_dict({"name": name, "budget": "1s", "steps": [{"id": "a", "tool": "t.py:f"}]})


def test_spec_dump_is_the_model_dump_computed_once() -> None:
    spec = _spec()
    first = spec_dump(spec)
    assert first == spec.model_dump(mode="json", by_alias=True)
    assert spec_dump(spec) is first
    other = _spec("other")
    assert spec_dump(other)["name"] == "other"


def test_spec_dump_entry_goes_with_its_spec() -> None:
    spec = _spec("short-lived")
    spec_dump(spec)
    key = id(spec)
    assert key in _dump._dumps
    del spec
    gc.collect()
    assert key not in _dump._dumps


def test_absolute_chain_root_is_resolved_once(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    _roots.add_chain_root(link)
    assert real.resolve() in _roots.chain_roots()
    assert os.fspath(link) in _roots._given
    _roots.add_chain_root(link)  # the cached path: still one root, not two
    assert _roots.chain_roots().count(real.resolve()) == 1


def test_relative_chain_root_is_resolved_each_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "rel").mkdir()
    monkeypatch.chdir(tmp_path)
    _roots.add_chain_root("rel")
    assert "rel" not in _roots._given  # depends on the working directory: never cached
    assert (tmp_path / "rel").resolve() in _roots.chain_roots()

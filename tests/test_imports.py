"""Tool and runnable references: files inside the chain's directory, or allow-listed modules."""

from __future__ import annotations

import json
import json.decoder
import os
import re
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from chainrt._errors import SpecError, ToolError
from chainrt.spec import (
    check_reference,
    parse_allowed_modules,
    resolve_callable,
    resolve_object,
)

DATA = Path(__file__).parent / "data" / "spec"


def write(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


def resolve(ref: str, chain_dir: Path, allowed: tuple[str, ...] = ()) -> Callable[..., Any]:
    return resolve_callable(ref, chain_dir=chain_dir, allowed_modules=allowed)


# ---------------------------------------------------------------------------------- files


def test_a_file_tool_resolves_relative_to_the_chain_dir_and_runs_once() -> None:
    fn = resolve("tools/orders.py:lookup_order", DATA)
    assert fn(order_id="7", user="u") == {"order_id": "7", "user": "u", "status": "shipped"}
    again = resolve("tools/orders.py:lookup_order", DATA)
    assert again is fn
    module = sys.modules[fn.__module__]
    assert module.LOADS == ["loaded"]  # executed once, however often it is resolved
    assert resolve("tools/../tools/orders.py:remember", DATA).__module__ == fn.__module__


def test_the_module_name_is_private_and_stable(tmp_path: Path) -> None:
    write(tmp_path / "t.py", "def f():\n    return 1\n")
    fn = resolve("t.py:f", tmp_path)
    assert fn.__module__.startswith("_chainrt_user_")
    assert fn.__module__.endswith("_t")
    other = tmp_path / "sub"
    write(other / "t.py", "def f():\n    return 2\n")
    fn2 = resolve("sub/t.py:f", tmp_path)
    assert fn2.__module__ != fn.__module__
    assert (fn(), fn2()) == (1, 2)


def test_a_dataclass_in_a_tool_file_works(tmp_path: Path) -> None:
    write(
        tmp_path / "dc.py",
        """
        from __future__ import annotations
        from dataclasses import dataclass

        @dataclass
        class Point:
            x: int

        def make(x: int) -> dict[str, int]:
            return {"x": Point(x).x}
        """,
    )
    assert resolve("dc.py:make", tmp_path)(x=3) == {"x": 3}


@pytest.mark.parametrize(
    ("ref", "fragment"),
    [
        ("../escape.py:f", "outside the chain's directory"),
        ("sub/../../escape.py:f", "outside the chain's directory"),
        ("/etc/passwd.py:f", "absolute path"),
        ("missing.py:f", "no file 'missing.py'"),
        ("sub/notes.txt:f", "not a .py file"),
    ],
)
def test_file_references_must_stay_inside_the_chain_dir(
    tmp_path: Path, ref: str, fragment: str
) -> None:
    chain_dir = tmp_path / "chain"
    write(chain_dir / "sub" / "notes.txt", "x")
    marker = tmp_path / "ran"
    write(tmp_path / "escape.py", f"open({os.fspath(marker)!r}, 'w').close()\ndef f(): pass\n")
    with pytest.raises(ToolError) as info:
        resolve(ref, chain_dir)
    assert fragment in str(info.value)
    with pytest.raises(SpecError) as spec_info:
        check_reference(ref, chain_dir, ())
    assert fragment in str(spec_info.value)
    assert not marker.exists()


def test_a_symlink_pointing_outside_the_chain_dir_is_refused(tmp_path: Path) -> None:
    chain_dir = tmp_path / "chain"
    chain_dir.mkdir()
    outside = write(tmp_path / "outside.py", "def f():\n    return 'outside'\n")
    (chain_dir / "link.py").symlink_to(outside)
    (chain_dir / "linkdir").symlink_to(tmp_path)
    for ref in ("link.py:f", "linkdir/outside.py:f"):
        with pytest.raises(ToolError, match="outside the chain's directory"):
            resolve(ref, chain_dir)
        with pytest.raises(SpecError, match="outside the chain's directory"):
            check_reference(ref, chain_dir, ())


def test_a_symlink_inside_the_chain_dir_is_fine(tmp_path: Path) -> None:
    write(tmp_path / "real" / "t.py", "def f():\n    return 'ok'\n")
    (tmp_path / "alias.py").symlink_to(tmp_path / "real" / "t.py")
    assert resolve("alias.py:f", tmp_path)() == "ok"


def test_a_syntax_error_is_reported_as_a_message_not_a_traceback(tmp_path: Path) -> None:
    write(tmp_path / "bad.py", "def ok():\n    pass\n\ndef broken(:\n    pass\n")
    with pytest.raises(ToolError) as info:
        resolve("bad.py:ok", tmp_path)
    message = str(info.value)
    assert "syntax error in bad.py line 4" in message
    assert "Traceback" not in message
    assert "\n" not in message
    # Nothing half-imported is left behind; the next try reports the same thing.
    assert not any(name.endswith("_bad") for name in sys.modules if name.startswith("_chainrt"))
    with pytest.raises(ToolError, match="syntax error"):
        resolve("bad.py:ok", tmp_path)


def test_an_exception_while_importing_names_it(tmp_path: Path) -> None:
    write(tmp_path / "boom.py", "raise RuntimeError('no config')\n")
    with pytest.raises(
        ToolError, match=re.escape("running boom.py raised RuntimeError: no config")
    ):
        resolve("boom.py:f", tmp_path)


def test_a_missing_attribute_lists_what_the_file_has() -> None:
    with pytest.raises(ToolError) as info:
        resolve("tools/orders.py:nope", DATA)
    assert "has no 'nope'" in str(info.value)
    assert "lookup_order" in str(info.value)


def test_a_tool_must_be_callable_but_a_runnable_object_need_not_be() -> None:
    with pytest.raises(ToolError, match="is int, not a function"):
        resolve("tools/orders.py:NOT_CALLABLE", DATA)
    assert resolve_object("tools/orders.py:NOT_CALLABLE", chain_dir=DATA, allowed_modules=()) == 42


def test_a_function_merely_imported_into_a_tool_file_is_refused(tmp_path: Path) -> None:
    write(tmp_path / "t.py", "from os import getcwd\nfrom os.path import join as join\n")
    with pytest.raises(SpecError, match=re.escape("imported into t.py from elsewhere")):
        resolve("t.py:getcwd", tmp_path)
    with pytest.raises(SpecError, match=re.escape("posixpath.join")):
        resolve("t.py:join", tmp_path)


BOUND = """\
import functools
import os
from operator import itemgetter
from random import randint

system = functools.partial(os.system, "true")
first = itemgetter(0)
bound_of_imported = functools.partial(randint, 1)


class Counter:
    def __init__(self):
        self.n = 0

    def bump(self, by=1):
        self.n += by
        return self.n

    def __call__(self):
        return self.bump()


counter = Counter()
bump = counter.bump


@functools.lru_cache(maxsize=None)
def cached(x=1):
    return x * 2


def plain():
    return "plain"
"""


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("randint", "random.Random.randint"),  # a bound method of random's hidden instance
        ("system", "posix.system"),  # a partial of an imported builtin
        ("first", "operator.itemgetter"),  # an instance of an imported class
        ("bound_of_imported", "random.Random.randint"),  # a partial of a bound method
    ],
)
def test_imported_callables_of_every_kind_are_refused(
    tmp_path: Path, name: str, shown: str
) -> None:
    """Issue 12 finding 9: bound methods and other imported callables passed the check."""
    write(tmp_path / "bm.py", BOUND)
    with pytest.raises(SpecError, match=re.escape(f"is {shown}, imported into bm.py")):
        resolve(f"bm.py:{name}", tmp_path)


@pytest.mark.parametrize("name", ["bump", "counter", "cached", "plain", "Counter"])
def test_callables_defined_in_the_file_resolve(tmp_path: Path, name: str) -> None:
    write(tmp_path / "bm.py", BOUND)
    assert callable(resolve(f"bm.py:{name}", tmp_path))


def test_check_reference_executes_no_user_code(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    write(tmp_path / "side.py", f"open({os.fspath(marker)!r}, 'w').close()\ndef f(): pass\n")
    check_reference("side.py:f", tmp_path, ())
    assert not marker.exists()
    resolve("side.py:f", tmp_path)
    assert marker.exists()


# -------------------------------------------------------------------------------- modules


def test_allowed_modules_and_their_submodules_resolve() -> None:
    assert resolve("json:dumps", DATA, ("json",)) is json.dumps
    assert resolve("json.decoder:JSONDecoder", DATA, ("json",)) is json.decoder.JSONDecoder
    assert resolve("json.decoder:JSONDecoder", DATA, ("json.decoder",)) is json.decoder.JSONDecoder
    check_reference("json:dumps", DATA, ["os", " json "])


@pytest.mark.parametrize(
    ("ref", "allowed"),
    [
        ("os:system", ()),
        ("os:system", ("json",)),
        ("jsonschema:validate", ("json",)),  # a prefix of the name is not a parent module
        ("json:dumps", ("json.decoder",)),  # a child does not allow its parent
    ],
)
def test_modules_off_the_allow_list_are_refused_before_any_import(
    ref: str, allowed: tuple[str, ...]
) -> None:
    with pytest.raises(ToolError, match="is not allowed"):
        resolve(ref, DATA, allowed)
    with pytest.raises(SpecError, match="CHAINRT_ALLOWED_MODULES"):
        check_reference(ref, DATA, allowed)


def test_a_missing_allowed_module_is_a_tool_error() -> None:
    with pytest.raises(ToolError, match=re.escape("No module named 'json.nothing_here'")):
        resolve("json.nothing_here:f", DATA, ("json",))


@pytest.mark.parametrize(
    ("ref", "fragment"),
    [
        ("no_colon", "is not a reference"),
        ("a.py:b:c", "is not a reference"),
        ("tools/orders.py:lookup.order", "is not a Python name"),
        ("tools/orders.py:__builtins__", "dunder names"),
        ("tools/orders.py:", "is not a Python name"),
        ("1bad-module:f", "neither a .py file nor a module name"),
    ],
)
def test_malformed_references(ref: str, fragment: str) -> None:
    with pytest.raises(ToolError, match="cannot import") as info:
        resolve(ref, DATA, ("json",))
    assert fragment in str(info.value)
    with pytest.raises(SpecError) as spec_info:
        check_reference(ref, DATA, ("json",))
    assert fragment in str(spec_info.value)


def test_parse_allowed_modules() -> None:
    assert parse_allowed_modules(" a.b, ,c ,") == ("a.b", "c")
    assert parse_allowed_modules("") == ()
    assert parse_allowed_modules(["x", " y "]) == ("x", "y")

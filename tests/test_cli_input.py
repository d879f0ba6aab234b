"""Bad input to the CLI, as a careless user or an attacker gives it (issue 12 findings 4, 6, 10, 14).

Every case ends with one line on stderr naming the problem and exit code 2, never a hang, a
traceback, an "internal error" or memory use that grows with what was offered.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from chainrt.cli import main
from chainrt.cli._input import MAX_INPUT_BYTES, MAX_INPUT_DEPTH, read_input
from chainrt.errors import InputError

CHAINS = Path(__file__).parent / "data" / "chains"
ROOT = Path(__file__).resolve().parents[1]
NOOP = str(CHAINS / "noop.yaml")


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("CHAINRT_STORE", url)
    return url


def _one_line_error(capsys: pytest.CaptureFixture[str], code: int, *needles: str) -> str:
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "internal error" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _env(cwd: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env["CHAINRT_STORE"] = f"sqlite:///{cwd / 'sub.db'}"
    return env


def _subprocess(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chainrt", *args],
        capture_output=True,
        text=True,
        env=_env(cwd),
        cwd=cwd,
        timeout=60,  # a hang (the FIFO bug) fails here instead of blocking the suite
        check=False,
    )


# ------------------------------------------------------------------ finding 4: bounded reads


def test_a_200_mb_input_file_is_refused_without_being_read(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    with big.open("wb") as fh:
        fh.truncate(200 * 1024 * 1024)  # sparse: costs no disk, reads as 200 MB of zeros
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match=f"larger than {MAX_INPUT_BYTES} bytes"):
            read_input(f"@{big}")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024, peak  # refused from its size: not one chunk of it was read


def test_an_input_file_just_over_the_limit_is_refused_and_one_at_it_is_read(
    tmp_path: Path,
) -> None:
    at_limit = tmp_path / "ok.json"
    at_limit.write_text('"' + "x" * (MAX_INPUT_BYTES - 2) + '"')
    assert len(read_input(f"@{at_limit}")) == MAX_INPUT_BYTES - 2
    over = tmp_path / "over.json"
    over.write_text('"' + "x" * (MAX_INPUT_BYTES - 1) + '"')
    with pytest.raises(InputError, match="larger than"):
        read_input(f"@{over}")


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_a_device_as_input_is_refused_at_once(
    device: str, capsys: pytest.CaptureFixture[str], store: str
) -> None:
    code = main(["run", NOOP, "--input", f"@{device}"])
    _one_line_error(capsys, code, device, "not a regular file")


# ------------------------------------------------------------------ finding 14: FIFOs


def test_validate_run_and_input_on_a_fifo_answer_without_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / "chain.yaml"
    os.mkfifo(fifo)
    for args in (["validate", str(fifo)], ["run", str(fifo), "--input", "{}"],
                 ["run", NOOP, "--input", f"@{fifo}"]):  # fmt: skip
        done = _subprocess(*args, cwd=tmp_path)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.count("\n") == 1, done.stderr
        assert "not a regular file" in done.stderr, done.stderr


def test_validate_on_a_folder_holding_a_fifo_answers_without_hanging(tmp_path: Path) -> None:
    """The folder walk sniffs every *.yaml it finds: a FIFO among them hung it (commit 7c8eef3)."""
    folder = tmp_path / "chains"
    folder.mkdir()
    os.mkfifo(folder / "a_pipe.yaml")
    (folder / "noop.yaml").write_text(Path(NOOP).read_text(encoding="utf-8"), encoding="utf-8")
    (folder / "tools.py").write_text((CHAINS / "tools.py").read_text("utf-8"), "utf-8")
    done = _subprocess("validate", str(folder), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "a_pipe.yaml" in done.stderr
    assert "not a regular file" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_folder_as_input_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is a directory"):
        read_input(f"@{tmp_path}")


# ------------------------------------------------------------------ finding 6: unclear errors


@pytest.mark.parametrize("depth", [MAX_INPUT_DEPTH + 1, 300, 5000])
def test_deep_nesting_is_one_clear_line(
    depth: int, capsys: pytest.CaptureFixture[str], store: str
) -> None:
    code = main(["run", NOOP, "--input", "[" * depth + "]" * depth])
    _one_line_error(capsys, code, f"nested deeper than {MAX_INPUT_DEPTH} levels")


def test_nesting_at_the_limit_is_accepted() -> None:
    depth = MAX_INPUT_DEPTH
    value = read_input('{"a":' * (depth - 1) + "[]" + "}" * (depth - 1))
    for _ in range(depth - 1):
        value = value["a"]
    assert value == []


@pytest.mark.parametrize(
    ("text", "where"),
    [('{"a": "\\ud800"}', "input.a"), ('["ok", "x\\udfff"]', "input[1]"), ('{"\\ud800": 1}', "")],
)
def test_lone_surrogates_are_named(
    text: str, where: str, capsys: pytest.CaptureFixture[str], store: str
) -> None:
    code = main(["run", NOOP, "--input", text])
    line = _one_line_error(capsys, code, "lone surrogate")
    assert where in line
    assert read_input('{"a": "\\ud83d\\ude00"}') == {"a": "\U0001f600"}  # a pair is fine


def test_input_file_that_is_not_utf8(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.json"
    bad.write_bytes(b'{"a": "caf\xe9"}')
    with pytest.raises(InputError, match="not UTF-8"):
        read_input(f"@{bad}")


def test_stdout_closed_before_output_is_quiet_141(tmp_path: Path) -> None:
    """`chainrt runs | head -3` with the reader gone before the first write: no traceback."""
    done = _subprocess("run", NOOP, "--input", "{}", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    read, write = os.pipe()
    os.close(read)  # nobody will ever read: the first write fails with EPIPE
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "chainrt", "runs"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(tmp_path),
            timeout=60,
            check=False,
        )
    finally:
        os.close(write)
    assert proc.returncode == 141, proc.stderr
    assert proc.stderr == ""


# ------------------------------------------------------------------ finding 10: quirks


def test_duplicate_keys_are_refused(capsys: pytest.CaptureFixture[str], store: str) -> None:
    code = main(["run", NOOP, "--input", '{"user": "a", "x": {"k": 1, "k": 2}, "user": "b"}'])
    _one_line_error(capsys, code, "key 'k' twice")


@pytest.mark.parametrize("option", ["--run-id", "--store", "--pool"])
def test_empty_options_are_refused_not_defaulted(
    option: str, capsys: pytest.CaptureFixture[str], store: str
) -> None:
    code = main(["run", NOOP, "--input", "{}", option, ""])
    _one_line_error(capsys, code, option, "must not be empty")


@pytest.mark.parametrize("command", [["runs"], ["inspect", "x"]])
def test_empty_store_is_refused_by_read_commands(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([*command, "--store", ""])
    _one_line_error(capsys, code, "--store must not be empty")


def test_a_long_run_id_is_not_echoed_in_full(
    capsys: pytest.CaptureFixture[str], store: str
) -> None:
    long_id = "x" * 10_000
    code = main(["run", NOOP, "--input", "{}", "--run-id", long_id])
    line = _one_line_error(capsys, code, "run id", "10000 characters")
    assert len(line) < 300
    for command in (["inspect", long_id], ["resume", long_id]):
        code = main(command)
        _, err = capsys.readouterr()
        assert code in (2, 3), err
        assert len(err) < 300, err


@pytest.mark.parametrize("budget", ["0.0000001ms", "0ms", "0.5ms", "0s"])
def test_budget_under_a_millisecond_is_refused(
    budget: str, capsys: pytest.CaptureFixture[str], store: str
) -> None:
    code = main(["run", NOOP, "--input", "{}", "--budget", budget])
    _one_line_error(capsys, code, "--budget must be at least 1ms")


def test_non_ascii_digits_are_not_a_budget(capsys: pytest.CaptureFixture[str], store: str) -> None:
    code = main(["run", NOOP, "--input", "{}", "--budget", "\u0663s"])  # Arabic-Indic three
    _one_line_error(capsys, code, "--budget must be a number with a unit")


def test_a_good_input_file_still_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], store: str
) -> None:
    good = tmp_path / "in.json"
    good.write_text(json.dumps({"note": "caf\u00e9 \U0001f600", "n": [1, 2, {"k": None}]}))
    code = main(["run", NOOP, "--input", f"@{good}", "--json", "--budget", "1ms"])
    out, err = capsys.readouterr()
    assert code in (0, 1), err  # 1 ms may or may not be enough for ten no-op steps
    assert json.loads(out)["budget"]["total_ms"] == 1.0

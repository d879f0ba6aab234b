"""A SQLite store that may not be written: read commands work, writes are refused (finding 8).

``chainrt runs`` and ``inspect`` open the store read-only, so a file on a read-only mount (or
another user's) can be read; ``sqlite:///x.db?mode=ro`` is honoured rather than ignored.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import chainrt
from chainrt.errors import CheckpointError
from chainrt.store import open_store

ROOT = Path(__file__).resolve().parents[1]
CHAINS = Path(__file__).parent / "data" / "chains"


def _make_store(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / "s.db"
    result = asyncio.run(
        chainrt.load(CHAINS / "noop.yaml").arun({}, run_id="done-1", store=f"sqlite:///{db}")
    )
    assert result.status == "completed"
    return db


def _count_runs(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT count(*) FROM runs").fetchone()[0])


def _cli(*args: str, cwd: Path, wrap: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("CHAINRT_STORE", None)
    return subprocess.run(
        [*(wrap or []), sys.executable, "-m", "chainrt", *args],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=60, check=False,
    )  # fmt: skip


def test_mode_ro_reads_and_refuses_writes(tmp_path: Path) -> None:
    db = _make_store(tmp_path)

    async def use() -> None:
        store = open_store(f"sqlite:///{db}?mode=ro")
        try:
            assert [r.run_id for r in await store.list_runs()] == ["done-1"]
            run = await store.get_run("done-1")
            assert run.status == "completed"
            assert len(await store.get_steps("done-1")) == 10
            copy = run.model_copy(update={"run_id": "new-1", "status": "running"})
            with pytest.raises(CheckpointError, match="read-only"):
                await store.create_run(copy)
        finally:
            await store.close()

    asyncio.run(use())
    assert _count_runs(db) == 1  # ?mode=ro was once ignored and the run written


def test_run_on_a_mode_ro_store_is_one_line(tmp_path: Path) -> None:
    db = _make_store(tmp_path)
    done = _cli("run", str(CHAINS / "noop.yaml"), "--input", "{}", "--store",
                f"sqlite:///{db}?mode=ro", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert done.stderr.count("\n") == 1
    assert "read-only" in done.stderr
    assert _count_runs(db) == 1
    assert not list(tmp_path.glob("**/*.db-journal"))


@pytest.mark.parametrize("query", ["?mode=rwx", "?cache=shared", "?mode=ro&journal=off"])
def test_unknown_sqlite_options_are_refused_not_ignored(tmp_path: Path, query: str) -> None:
    with pytest.raises(CheckpointError, match="the only option is mode=ro"):
        open_store(f"sqlite:///{tmp_path / 'x.db'}{query}")
    assert not (tmp_path / "x.db").exists()


def test_runs_in_a_fresh_folder_creates_nothing(tmp_path: Path) -> None:
    done = _cli("runs", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "no runs"
    assert list(tmp_path.iterdir()) == []  # no .chainrt/ for a read


async def test_a_file_without_chainrt_tables_reads_as_empty(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    store = open_store(f"sqlite:///{other}?mode=ro")
    try:
        assert await store.list_runs() == []
    finally:
        await store.close()
    with sqlite3.connect(other) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    assert tables == ["t"]


def _read_only_mount(folder: Path) -> list[str]:
    """A command prefix that runs what follows with ``folder`` mounted read-only.

    Root ignores file permissions, so a chmod proves nothing in CI containers; a read-only bind
    mount in a private user and mount namespace stops root and anyone else alike.
    """
    unshare = shutil.which("unshare")
    probe = ["sh", "-c", f"mount --bind {folder} {folder} && mount -o remount,bind,ro {folder} "
             f"&& ! touch {folder}/probe 2>/dev/null"]  # fmt: skip
    if unshare is None or subprocess.run([unshare, "-rm", *probe], check=False).returncode != 0:
        pytest.skip("needs unshare -rm (user and mount namespaces) for a read-only mount")
    script = f'mount --bind {folder} {folder} && mount -o remount,bind,ro {folder} && exec "$@"'
    return [unshare, "-rm", "sh", "-c", script, "sh"]


@pytest.mark.parametrize("command", [["runs"], ["runs", "--json"], ["inspect", "done-1"],
                                     ["inspect", "done-1", "--json"]])  # fmt: skip
def test_read_commands_work_on_a_read_only_mount(tmp_path: Path, command: list[str]) -> None:
    db = _make_store(tmp_path / "ro")
    before = db.read_bytes()
    wrap = _read_only_mount(tmp_path / "ro")
    done = _cli(*command, "--store", f"sqlite:///{db}", cwd=tmp_path, wrap=wrap)
    assert done.returncode == 0, done.stderr  # was: "attempt to write a readonly database"
    assert "done-1" in done.stdout
    assert db.read_bytes() == before
    run = _cli("run", str(CHAINS / "noop.yaml"), "--input", "{}", "--store", f"sqlite:///{db}",
               cwd=tmp_path, wrap=wrap)  # fmt: skip
    assert run.returncode == 3  # a write command still says the store cannot be used
    assert run.stderr.count("\n") == 1, run.stderr

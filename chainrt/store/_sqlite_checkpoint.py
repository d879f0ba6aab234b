"""Background WAL checkpoints for the SQLite checkpoint store (see ``Checkpointer``)."""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

__all__ = ["BACKSTOP_CHECKPOINT_PAGES", "Checkpointer"]

logger = logging.getLogger("chainrt.store")

CHECKPOINT_EVERY = 256  # write transactions between two background checkpoints
BACKSTOP_CHECKPOINT_PAGES = 16_000  # inline checkpoint only if the thread falls far behind


class Checkpointer:
    """Copies the write-ahead log into the database file, on a thread of its own.

    A checkpoint fsyncs. Run inline (SQLite's autocheckpoint) it stalls the committing call, and
    with it the event loop, for milliseconds every few hundred commits. Here it runs beside the
    loop (sqlite3 releases the GIL while it works) in PASSIVE mode, which never blocks a writer.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._writes = 0
        self._stopping = False
        self._wake = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"chainrt-checkpoint-{path.name}", daemon=True
        )
        self._thread.start()

    def wrote(self) -> None:
        """Count one write transaction; wake the thread every ``CHECKPOINT_EVERY``."""
        self._writes += 1
        if self._writes >= CHECKPOINT_EVERY:
            self._writes = 0
            self._wake.set()

    def stop(self) -> None:
        """Stop the thread (waits for a checkpoint in progress)."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        try:
            conn = sqlite3.connect(self._path, isolation_level=None)
        except sqlite3.Error as exc:
            logger.warning("no background checkpoints for %s: %s", self._path, exc)
            return
        try:
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._stopping:
                    return
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error as exc:  # the inline backstop still bounds the log
                    logger.warning("background checkpoint of %s failed: %s", self._path, exc)
        finally:
            conn.close()

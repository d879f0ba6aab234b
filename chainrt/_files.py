"""Reading a file a person names, bounded: regular files only, never more than a limit.

``open()`` on a FIFO blocks until a writer appears, and ``read()`` on ``/dev/zero`` never ends;
a 200 MB file would be read whole before a size check. :func:`read_bounded` opens without
blocking, refuses anything but a regular file, refuses a file already over the limit from its
size, and reads at most one byte past the limit (a file that grows while read is caught too).
"""

from __future__ import annotations

import os
import stat

__all__ = ["FileRefused", "read_bounded"]


class FileRefused(Exception):
    """The file cannot be read as asked; ``str()`` is the reason, one line, without the path."""


def read_bounded(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of regular file ``path`` if it has at most ``limit`` of them; else FileRefused."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise FileRefused("no such file") from None
    except OSError as exc:
        raise FileRefused(f"cannot open it: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise FileRefused("is a directory, not a file")
        if not stat.S_ISREG(info.st_mode):
            raise FileRefused(
                "is not a regular file (a FIFO, socket or device); write the content to a file"
            )
        if info.st_size > limit:
            raise FileRefused(f"file is larger than {limit} bytes ({info.st_size:,} bytes)")
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise FileRefused(f"file is larger than {limit} bytes (it grew while read)")
        return b"".join(chunks)
    except OSError as exc:
        raise FileRefused(f"cannot read it: {exc.strerror or exc}") from None
    finally:
        os.close(fd)

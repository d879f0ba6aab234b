"""``python -m workers serve ...`` — the same as ``chainrt-worker serve ...``."""

from __future__ import annotations

import sys

from workers.cli import main

if __name__ == "__main__":
    sys.exit(main())

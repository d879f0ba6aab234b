"""chainrt's version, in a module of its own so that the runtime core can name it without
importing the package's public face (``chainrt.__version__`` re-exports it; docs/architecture.md)."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"

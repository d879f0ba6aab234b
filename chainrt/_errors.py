"""Compatibility: the error tree moved to the public :mod:`chainrt.errors`; import from there."""

from __future__ import annotations

from .errors import *  # noqa: F403
from .errors import __all__ as __all__

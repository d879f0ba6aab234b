"""Which stored runs a runner will execute: chain roots and signed records (docs/security.md).

A resumed run is rebuilt from its record alone, and anyone who can write to the store can write
a record. Before a runner claims a stored run it checks, with its own settings only:

1. the record's signature, when the runner has a ``CHAINRT_RECORD_KEY``: an HMAC-SHA256 over
   the run id, chain name, spec, chain folder and input, written when the run was created;
2. the chain folder the record names, when the spec has file references (``tools.py:fn``): it
   must lie inside one of the runner's chain roots (:mod:`chainrt.spec._roots`);
3. every tool and runnable reference: a file inside that folder, or a module on the runner's
   ``CHAINRT_ALLOWED_MODULES``.

Anything else is :class:`~chainrt.errors.UntrustedRecord`, one line, and the run is left as is.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .._errors import InputError, UntrustedRecord
from .._records import RunRecord
from .._settings import Settings
from ..spec import ChainSpec
from ..spec._flow_check import all_steps
from ..spec._imports import is_file_reference, reference_problem
from ..spec._roots import chain_roots, inside_roots, parse_chain_roots

__all__ = ["RecordTrust", "record_mac"]

_MAC_PREFIX = "hmac-sha256:"
_PASSED_FOR_S = 2.0
"""How long a passed folder-and-references check is reused for another run of the same chain
folder and references. The check resolves every path (``realpath``, a few ``lstat`` each): under
``chainrt serve`` a burst of one chain's runs paid it for every run (~0.2 ms of a ~4 ms run's
server CPU). Only passes are kept, and only this long: a tool file removed or a folder moved out
of the roots is refused again within this time (the tool's own call resolves it again anyway)."""
_PASSED_MAX = 256
"""Most passed checks kept at once (the oldest half is dropped past it)."""
_SHOWN = 200
"""Longest stored text quoted in a refusal (a record may hold anything)."""


def _shown(text: str) -> str:
    quoted = repr(text)
    return quoted if len(quoted) <= _SHOWN else quoted[: _SHOWN - 3] + "..."


def record_mac(key: bytes, record: RunRecord) -> str:
    """The signature of what a run executes: run id, chain, spec, chain folder and input."""
    payload = {
        "run_id": record.run_id,
        "chain": record.chain,
        "spec": record.spec,
        "source": record.source,
        "input": record.input,
    }
    try:
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InputError(f"run {record.run_id}: its input cannot be signed: {exc}") from None
    digest = hmac.new(key, text.encode("ascii"), hashlib.sha256).hexdigest()
    return _MAC_PREFIX + digest


@dataclass(frozen=True)
class RecordTrust:
    """A runner's own rules for stored runs: its chain roots, allowed modules and record key.

    ``roots`` are the configured ones; folders added in this process
    (:func:`chainrt.spec._roots.add_chain_root`, chain files loaded) count too.
    """

    roots: tuple[Path, ...] = (Path("chains"),)
    allowed_modules: tuple[str, ...] = ()
    key: bytes | None = None
    _passed: dict[tuple[str | None, tuple[str, ...]], tuple[float, Path | None]] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )

    @classmethod
    def from_settings(cls, settings: Settings, allowed_modules: Sequence[str] = ()) -> RecordTrust:
        """The rules of ``CHAINRT_CHAIN_ROOTS`` and ``CHAINRT_RECORD_KEY``."""
        key = settings.record_key.get_secret_value() if settings.record_key else None
        return cls(
            roots=parse_chain_roots(settings.chain_roots),
            allowed_modules=tuple(allowed_modules),
            key=key.encode() if key else None,
        )

    def sign(self, record: RunRecord) -> RunRecord:
        """``record`` with its signature, when this runner has a key."""
        if self.key is None:
            return record
        return record.model_copy(update={"mac": record_mac(self.key, record)})

    def check(self, record: RunRecord, spec: ChainSpec) -> Path | None:
        """The chain folder to resolve the stored run's files in; UntrustedRecord if refused.

        Returns None when the spec has no file references (nothing is resolved in a folder).
        """
        run_id = record.run_id
        if self.key is not None:
            if record.mac is None:
                raise UntrustedRecord(
                    f"run {run_id} is not signed, and this runner requires signed records "
                    "(CHAINRT_RECORD_KEY is set); it was not claimed"
                )
            if not hmac.compare_digest(record.mac, record_mac(self.key, record)):
                raise UntrustedRecord(
                    f"run {run_id}: its record's signature does not match (altered in the store, "
                    "or signed with another CHAINRT_RECORD_KEY); it was not claimed"
                )
        refs = [
            (step.id, kind, ref)
            for step in all_steps(spec)
            for kind, ref in (("tool", step.tool), ("runnable", step.runnable))
            if ref is not None
        ]
        refs += [  # an agent's tools (chainrt/spec/_agent.py)
            (step.id, "agent tool", entry.tool)
            for step in all_steps(spec)
            if step.agent is not None
            for entry in step.agent.tools
        ]
        # The working directory counts where no folder is stored, or none is needed.
        memo = (record.source or None, tuple(ref for _, _, ref in refs))
        now = time.monotonic()
        passed = self._passed.get(memo)
        if passed is not None and now - passed[0] < _PASSED_FOR_S:
            return passed[1]
        folder: Path | None = None
        if any(is_file_reference(ref) for _, _, ref in refs):
            folder = self._folder(record)
        for step_id, kind, ref in refs:
            problem = reference_problem(ref, folder or Path.cwd(), self.allowed_modules)
            if problem is not None:
                raise UntrustedRecord(
                    f"run {run_id}: step {_shown(step_id)} {kind} {_shown(ref)} is refused by this "
                    f"runner: {problem[: _SHOWN * 2]}; it was not claimed"
                )
        if folder is not None:  # (a check without a folder resolves no path: nothing to keep)
            if len(self._passed) >= _PASSED_MAX:
                for old in list(self._passed)[: _PASSED_MAX // 2]:
                    del self._passed[old]
            self._passed[memo] = (now, folder)
        return folder

    def _folder(self, record: RunRecord) -> Path:
        roots = chain_roots(self.roots)
        stored = Path(record.source) if record.source else Path.cwd()
        folder = inside_roots(stored, roots)
        if folder is None:
            shown = ", ".join(str(root) for root in roots) or "none"
            raise UntrustedRecord(
                f"run {record.run_id}: its chain folder {_shown(str(stored))} is outside this runner's "
                f"chain roots ({shown}); add the folder with --chains or CHAINRT_CHAIN_ROOTS if "
                "you trust it. The run was not claimed"
            )
        return folder

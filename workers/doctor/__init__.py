"""``chainrt-worker doctor``: is this machine's driver / CUDA / torch / vLLM stack known to work?

    chainrt-worker doctor            # versions, GPUs, findings; exit 1 on a known-bad combination
    chainrt-worker doctor --json     # the same as one JSON object

The checks are pure (:func:`check` over :class:`Facts`), so each row of the known-bad table is
tested with faked facts; :func:`probe` reads the real machine.
"""

from __future__ import annotations

import json
import sys
from typing import TextIO

from ._checks import Finding, check, load_table
from ._probe import WATCHED, Facts, Gpu, probe

__all__ = ["WATCHED", "Facts", "Finding", "Gpu", "check", "load_table", "probe", "run"]


def run(*, as_json: bool, out: TextIO = sys.stdout, facts: Facts | None = None) -> int:
    """Probe (unless ``facts`` is given), check, print; 1 when a known-bad combination is found."""
    facts = probe() if facts is None else facts
    findings = check(facts, load_table())
    bad = any(f.level == "error" for f in findings)
    if as_json:
        body = {
            "ok": not bad,
            "facts": facts.as_dict(),
            "findings": [f.as_dict() for f in findings],
        }
        out.write(json.dumps(body, indent=2) + "\n")
        return 1 if bad else 0
    out.write(f"python {facts.python}; NVIDIA driver {facts.driver or 'none'}; ")
    out.write(f"torch CUDA runtime {facts.cuda_runtime or 'none (CPU build)'}\n")
    for name, version in facts.packages.items():
        out.write(f"  {name:<18} {version or '-'}\n")
    for gpu in facts.gpus:
        out.write(
            f"  GPU {gpu.index}: {gpu.name} (sm {gpu.capability or '?'}), "
            f"{gpu.free_mib or 0:.0f} of {gpu.total_mib or 0:.0f} MiB free\n"
        )
    for note in facts.notes:
        out.write(f"  note: {note}\n")
    for f in findings:
        out.write(f"{f.level.upper():<7} {f.check}: {f.message}\n")
        if f.fix:
            out.write(f"        fix: {f.fix}\n")
        if f.source:
            out.write(f"        source: {f.source}\n")
    out.write("doctor: known-bad combination found\n" if bad else "doctor: no known problem\n")
    return 1 if bad else 0

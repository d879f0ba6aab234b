"""The commit script's EVALSHA packed in one format: the same bytes as the generic packer."""

from __future__ import annotations

import pytest

from chainrt.redis import pack_args
from chainrt.store._commit_wire import commit_wire

HEAD = b"*16\r\n" + pack_args(("EVALSHA", "0" * 40, "2"))
KEYS = ("chainrt:run:{r-1}", "chainrt:steps:{r-1}")


@pytest.mark.parametrize(
    "args",
    [
        # a step's commit: progress and step JSON as bytes, the rest as text
        ["1", "running", b'{"status":"running"}', "1764650000.123", "", b"", "0", "1", "s1",
         b'{"step_id":"s1"}', "0"],
        # a final commit without a step, with a trace, a new budget and a record TTL
        ["12", "completed", b"{}", "1.5", "2500.0", b'{"trace_id":"ab"}', "1", "0", "", b"",
         "604800000"],
        # text beyond ASCII (its UTF-8 length is what RESP counts), empty values, \r\n inside
        ["3", "failed", "é\r\n".encode(), "0.0", "", b"", "0", "1", "étape ✓", b"", "1"],
    ],
)  # fmt: skip
def test_the_same_bytes_as_the_generic_packer(args: list[str | bytes]) -> None:
    assert commit_wire(HEAD, KEYS, args) == HEAD + pack_args((*KEYS, *args))


def test_another_shape_goes_through_the_generic_packer() -> None:
    args: list[str | bytes] = ["1", b"two"]
    assert commit_wire(HEAD, KEYS, args) == HEAD + pack_args((*KEYS, *args))

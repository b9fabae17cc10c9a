"""The multiple every segment's length is padded to, as the trainer's parallelism asks.

Context parallelism splits every sample into `2 x cp_size` equal chunks. With sequence
parallelism, tensor-parallel ranks split each CP rank's tokens again, so Megatron-Bridge asks
for `lcm(2 x cp_size, cp_size x tp_size)`, even at cp_size 1; without sequence parallelism
tp_size changes nothing. Plain integers only: the configuration (and with it the CLI's start-up)
reads this without numpy.
"""

from __future__ import annotations

import math


def cp_multiple(cp_size: int, tp_size: int = 1, sequence_parallel: bool = False) -> int:
    """What every segment's padded length is a multiple of (1 when nothing asks for one)."""
    cp = 2 * cp_size if cp_size > 1 else 1
    sp = cp_size * tp_size if sequence_parallel and tp_size > 1 else 1
    return math.lcm(cp, sp)


def config_multiple(config: dict) -> int:
    """The segment multiple an output was packed with, from its manifest's `config`."""
    return cp_multiple(
        int(config.get("cp_size") or 1),
        int(config.get("tp_size") or 1),
        bool(config.get("sequence_parallel")),
    )


def multiple_text(cp_size: int, tp_size: int = 1, sequence_parallel: bool = False, name=str) -> str:
    """How messages name the multiple: `2 x cp_size = 4`, `cp_size x tp_size = 4`, or
    `lcm(2 x cp_size, cp_size x tp_size) = 8`; `name` spells an option's name (a flag)."""
    mult = cp_multiple(cp_size, tp_size, sequence_parallel)
    cp, tp = name("cp_size"), name("tp_size")
    if not sequence_parallel or tp_size < 2:
        return f"2 x {cp} = {mult}"
    if cp_size < 2:
        return f"{cp} x {tp} = {mult}"
    return f"lcm(2 x {cp}, {cp} x {tp}) = {mult}"

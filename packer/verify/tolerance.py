"""The attention check's tolerance, derived from the dtype and the segment lengths.

A kernel in fp16/bf16 gets q, k, v already rounded to that dtype; the fp32 reference is run on
those same rounded values, so what separates the two is only the kernel's own arithmetic:

- the output is rounded to the dtype: |error| <= u |o| <= u V, where u is the dtype's unit
  roundoff (2^-11 fp16, 2^-8 bf16, 2^-24 fp32) and V = max |v| (an output is a convex
  combination of value rows, so |o| <= V);
- the probabilities P enter the P @ V product rounded to the dtype (flash-attn, torch's varlen
  kernel and FlexAttention all do this): each weight is off by at most u p_j, so the output by
  at most u sum_j p_j |v_j| <= u V;
  (in fp16 a tiny weight falls among the subnormals, where the rounding step is absolute,
  at most 2^-25: over n keys these add up like the sums below);
- the scores, the softmax sums and the P @ V sums accumulate in fp32 over the n keys of a
  segment; rounding errors of a long sum grow like sqrt(n) (Higham and Mary, "A New Approach to
  Probabilistic Rounding Error Analysis", 2019), bounded here by LAMBDA sqrt(n) u32 V.

So one kernel output is within `V (2 u + LAMBDA sqrt(n) (u32 + s))` of the exact attention of
its inputs (s: the dtype's subnormal rounding step, 2^-25 in fp16, negligible in bf16 and fp32),
whatever the number of outputs compared: the 2 u V part is a worst-case bound, the sqrt(n) part
a probabilistic one. The check compares a packed output with the sample run alone and with the fp32
reference; both are held to this bound. Tested on the CPU with an emulation of the kernels'
rounding (tests/test_verify_tolerance.py), and on a GPU by scripts/gpu_check.py.
"""

from __future__ import annotations

import math

UNIT_ROUNDOFF = {"fp16": 2.0**-11, "bf16": 2.0**-8, "fp32": 2.0**-24}
ACCUMULATE = UNIT_ROUNDOFF["fp32"]  # the kernels accumulate in fp32
SUBNORMAL = {"fp16": 2.0**-25, "bf16": 2.0**-134, "fp32": 2.0**-150}  # half the least step
LAMBDA = 4.0  # the probabilistic bound's constant: sqrt(n) u32 grows no faster than this
RULE = "max|v| x (2 u + 4 sqrt(n) (u_fp32 + s))"


def tolerance(dtype: str, length: int, value_bound: float) -> float:
    """The largest difference a correct `dtype` kernel can show against the exact attention of
    its inputs over segments of up to `length` keys whose values are at most `value_bound`."""
    u = UNIT_ROUNDOFF[dtype]
    n = max(int(length), 1)
    return float(value_bound) * (2.0 * u + LAMBDA * math.sqrt(n) * (ACCUMULATE + SUBNORMAL[dtype]))

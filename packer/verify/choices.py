"""The attention backends and dtypes `verify` offers, by name (light: the CLI's help reads them
without loading numpy, torch or the checks)."""

from __future__ import annotations

BACKENDS = ("flash-attn-3", "flash-attn", "torch-varlen", "flex", "cpu")
DTYPES = ("bf16", "fp16", "fp32")

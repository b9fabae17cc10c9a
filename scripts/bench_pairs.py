"""Preference pairs packed against TRL's padded DPO batches: rows, tokens processed, pack time.

The pairs are `scripts/make_pairs.py`'s lognormal mix (prompts of median 120 tokens, chosen
280, rejected 230, long tails). packer packs them with `pack --pairs` (`--overlength
truncate`) into rows of L; the same pairs, as packer kept them (truncated where it truncated),
go through TRL's own `DataCollatorForPreference` in batches of B pairs in dataset order, as
`DPOTrainer` draws them, and every padded tensor it returns is counted. Tokens processed is
what the model runs on: packed rows hold only real tokens (the `flatten` layout; `pad` to L
adds the last-row padding shown as "rows x L"), a TRL batch is `2B x longest` tokens. The pack
time is `packer.pack` on the JSONL file, end to end (read, check, plan, write, hash), median of
`--repeat` runs.

    python scripts/bench_pairs.py --pairs 10000 -L 4096 --batch 4 8 16
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _make_pairs_module():
    path = Path(__file__).with_name("make_pairs.py")
    spec = importlib.util.spec_from_file_location("make_pairs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def trl_padded(prompt, chosen, rejected, batch: int) -> tuple[int, int]:
    """(sequences, tokens) of TRL's DataCollatorForPreference over batches of `batch` pairs."""
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    collator = DataCollatorForPreference(pad_token_id=0)
    sequences = tokens = 0
    for a in range(0, len(prompt), batch):
        examples = [
            {"prompt_ids": [1] * int(p), "chosen_ids": [1] * int(c), "rejected_ids": [1] * int(r)}
            for p, c, r in zip(
                prompt[a : a + batch], chosen[a : a + batch], rejected[a : a + batch]
            )
        ]
        out = collator(examples)
        sequences += out["input_ids"].shape[0]
        tokens += out["input_ids"].numel()
    return sequences, tokens


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=10000)
    ap.add_argument("-L", "--max-len", type=int, default=4096)
    ap.add_argument("--batch", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    opts = ap.parse_args()

    import packer
    from packer.planning.pairs import resolve_pairs

    make_pairs = _make_pairs_module()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "pairs.jsonl"
        with open(src, "w", encoding="utf-8") as fh:
            import json

            for pair in make_pairs.make_pairs(opts.pairs, opts.seed):
                fh.write(json.dumps(pair, separators=(",", ":")) + "\n")
        cfg = packer.PackConfig(max_len=opts.max_len, pairs=True, overlength="truncate")
        times, result = [], None
        for i in range(opts.repeat):
            t = time.perf_counter()
            result = packer.pack(src, Path(tmp) / f"out{i}", cfg)
            times.append(time.perf_counter() - t)
    stats = result.stats
    lengths = make_pairs.pair_lengths(opts.pairs, opts.seed)
    kept = resolve_pairs(*lengths.T, opts.max_len, "truncate")
    assert int(kept.item_lengths.sum()) == stats["tokens"]
    real = stats["tokens"]
    rows = stats["rows"]
    print(
        f"{opts.pairs:,} pairs (truncated {stats['truncated']}), L = {opts.max_len:,}: "
        f"{real:,} real tokens ({stats['loss_tokens']:,} completion tokens), "
        f"{rows:,} packed rows, lower bound {stats['lower_bound']:,}"
    )
    print(
        f"pack time: median {statistics.median(times):.2f} s of {opts.repeat} "
        f"({', '.join(f'{t:.2f}' for t in times)}), "
        f"{real / statistics.median(times) / 1e6:.1f} M tokens/s end to end"
    )
    print()
    print("| layout | sequences (rows) | tokens processed | padding | tokens vs packed |")
    print("|---|---:|---:|---:|---:|")
    print(f"| packer --pairs, flatten | {rows:,} | {real:,} | 0.0 % | 1.00 |")
    padded = rows * opts.max_len
    print(
        f"| packer --pairs, pad to L | {rows:,} | {padded:,} | "
        f"{100 * (padded - real) / padded:.1f} % | {padded / real:.2f} |"
    )
    for b in opts.batch:
        seqs, tokens = trl_padded(kept.prompt, kept.chosen, kept.rejected, b)
        print(
            f"| TRL DataCollatorForPreference, {b} pairs/batch | {seqs:,} | {tokens:,} | "
            f"{100 * (tokens - real) / tokens:.1f} % | {tokens / real:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

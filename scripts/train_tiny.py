"""Train a tiny random Llama-style model on packed shards, on CPU, and print the loss per step.

The whole path a real run takes, at toy size: pack the bundled sample (or use an existing packer
output), read it memory-mapped with `PackedDataset`, batch it with `PackedBatchSampler`, collate
with `collate_packed`, and average the loss per token over each optimizer step (gradient
accumulation included) using `num_loss_tokens`.

    python scripts/train_tiny.py                      # packs data/sample.jsonl.gz to a temp dir
    python scripts/train_tiny.py --packed out/demo --mode pad --steps 5

The sample's tokens are random ids, so the loss can only fall slowly from about ln(32000) = 10.4;
the point is the mechanics, not the model.
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

import packer
from packer.torch import (
    PackedBatchSampler,
    PackedDataset,
    check_isolation,
    collate_packed,
    model_inputs,
)
from packer.torch.loss import step_loss_tokens
from packer.torch.tiny_model import build_tiny_model

ROOT = Path(__file__).resolve().parent.parent


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--data",
        default=str(ROOT / "data" / "sample.jsonl.gz"),
        help="token dataset to pack (ignored with --packed)",
    )
    ap.add_argument("--packed", default=None, help="an existing packer output directory")
    ap.add_argument("--max-len", type=int, default=512, help="row length when packing")
    ap.add_argument("--mode", choices=["flatten", "pad"], default="flatten", help="collate mode")
    ap.add_argument("--batch-size", type=int, default=2, help="packed rows per micro-batch")
    ap.add_argument("--accum", type=int, default=2, help="micro-batches per optimizer step")
    ap.add_argument("--steps", type=int, default=8, help="optimizer steps")
    ap.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    ap.add_argument("--seed", type=int, default=0, help="model init and data order seed")
    return ap.parse_args()


def micro_batches(sampler: PackedBatchSampler, loader: DataLoader):
    """Micro-batches forever, one epoch after another, each epoch in its own seeded order."""
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def train(packed: Path, args: argparse.Namespace) -> list[float]:
    torch.manual_seed(args.seed)
    dataset = PackedDataset(packed)
    sampler = PackedBatchSampler(dataset, batch_size=args.batch_size, seed=args.seed)
    loader = DataLoader(
        dataset, batch_sampler=sampler, collate_fn=functools.partial(collate_packed, mode=args.mode)
    )
    model = build_tiny_model(seed=args.seed, vocab_size=32000, hidden_size=64).train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    print(
        f"{len(dataset)} packed rows from {packed}, {args.mode} batches of {args.batch_size} "
        f"rows, {args.accum} micro-batches per step"
    )
    batches = micro_batches(sampler, loader)
    # the model, its config and this loop's call, packed vs each sample alone; raises on a leak
    report = check_isolation(model, next(iter(loader)))
    print(
        f"isolation: {report.samples} samples, packed vs alone logits within "
        f"{report.max_logits_diff:.2g} (tolerance {report.tolerance:g})"
    )
    losses = []
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        micro = [next(batches) for _ in range(args.accum)]
        n_tokens = step_loss_tokens(micro)  # summed over ranks too when distributed
        step_loss = 0.0
        for batch in micro:
            # loss = (summed token loss of this micro-batch) / (loss tokens of the whole step)
            out = model(**model_inputs(batch), num_items_in_batch=n_tokens)
            out.loss.backward()
            step_loss += out.loss.item()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(step_loss)
        tokens = sum(b["input_ids"].numel() for b in micro)
        print(
            f"step {step:3d}  loss {step_loss:.4f}  loss tokens {n_tokens:6d}  "
            f"tokens {tokens:6d}  {time.perf_counter() - t0:.2f}s",
            flush=True,
        )
    return losses


def main() -> None:
    args = parse_args()
    if args.packed:
        train(Path(args.packed), args)
        return
    with tempfile.TemporaryDirectory(prefix="packer-train-") as tmp:
        out = Path(tmp) / "packed"
        result = packer.pack(
            [args.data], out, packer.PackConfig(max_len=args.max_len, overlength="split")
        )
        print(
            f"packed {result.stats['samples_in']} samples into {result.stats['rows']} rows "
            f"of {args.max_len} tokens (efficiency {result.stats['efficiency']:.2%})"
        )
        train(out, args)


if __name__ == "__main__":
    main()

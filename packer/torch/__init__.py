"""Feeding packed shards to PyTorch trainers: dataset, collator, multi-rank sampler, loss scaling.

This subpackage needs torch; the packing code never imports it (`import packer` stays torch-free).
Inside it, `import torch` is an absolute import and resolves to PyTorch, not to this package.

    from packer.torch import PackedDataset, PackedBatchSampler, collate_packed

    ds = PackedDataset("out/demo")
    sampler = PackedBatchSampler(ds, batch_size=4, seed=0)
    loader = DataLoader(ds, batch_sampler=sampler, collate_fn=collate_packed)

For context parallelism, `cp_shard(batch, cp_rank, cp_size)` gives one CP rank's share of a
flattened batch (docs/context-parallel.md). See docs/training.md for the loops (plain PyTorch, Hugging Face Trainer,
TRL) and `check_isolation`, which proves a model and its training call keep the samples apart;
`check_trainer(trainer)` proves a TRL trainer's own data path keeps them apart (docs/export.md).
"""

try:
    import torch  # noqa: F401  (PyTorch: absolute import)
except ImportError as exc:  # the core install: say which extra brings torch
    raise ImportError(
        "packer.torch needs torch, which the core install leaves out: "
        "pip install torch (packer's 'verify' extra)"
    ) from exc

from packer.contract.schema import CONTRACT_COLUMNS
from packer.torch.collate import MODES, block_causal_mask, collate_packed, model_inputs
from packer.torch.cp_shard import cp_shard, shifted_labels
from packer.torch.data import PackedDataset, load_hf_dataset
from packer.torch.isolation import IsolationError, IsolationReport, check_isolation
from packer.torch.loss import step_loss_tokens, sum_token_loss
from packer.torch.preference import (
    PairLogps,
    collate_pairs,
    dpo_loss,
    last_token_scores,
    pair_logps,
    reward_loss,
    segment_logps,
)
from packer.torch.sampler import PackedBatchSampler, plan_batches
from packer.torch.trainer_check import TrainerCheckError, check_batch, check_trainer


def __getattr__(name: str):
    """`CheckTrainerCallback` imports transformers: loaded when first asked for."""
    if name == "CheckTrainerCallback":
        from packer.torch.trainer_callback import CheckTrainerCallback

        return CheckTrainerCallback
    raise AttributeError(f"module 'packer.torch' has no attribute {name!r}")


__all__ = [
    "CONTRACT_COLUMNS",
    "CheckTrainerCallback",
    "IsolationError",
    "IsolationReport",
    "MODES",
    "PackedBatchSampler",
    "PairLogps",
    "PackedDataset",
    "TrainerCheckError",
    "block_causal_mask",
    "check_batch",
    "check_isolation",
    "check_trainer",
    "collate_packed",
    "collate_pairs",
    "cp_shard",
    "dpo_loss",
    "last_token_scores",
    "load_hf_dataset",
    "model_inputs",
    "pair_logps",
    "plan_batches",
    "reward_loss",
    "segment_logps",
    "shifted_labels",
    "step_loss_tokens",
    "sum_token_loss",
]

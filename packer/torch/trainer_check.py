"""`check_trainer`: a TRL (or HF) trainer's own data path keeps packer's samples apart.

`packer export --to trl` writes rows with `seq_lengths`; whether they train as packed samples
depends on the trainer's settings, and two wrong ones train without a warning (TRL 1.16):

- `padding_free=False` (TRL's default): the collator sends an all-ones `attention_mask` and no
  `position_ids`, so each row trains as one sequence, its samples attending to each other;
- `packing=True` without `dataset_kwargs={"skip_prepare_dataset": True}`: TRL re-packs whole
  rows into longer ones and its `seq_lengths` replace packer's, so positions restart only where
  a packer row starts.

`check_trainer(trainer)` draws one batch through `trainer.get_train_dataloader()` (the trainer's
sampler and collator), finds each of its rows in packer's export, and raises `TrainerCheckError`
naming the setting to change unless every position restarts at packer's sample boundaries, no
`attention_mask` spans them, and (with `model_check`) the trainer's model gives each sample of
the batch the logits it gives the sample alone (`check_isolation`). Drawing the batch moves
torch's random state as any extra draw from the loader does.
"""

from __future__ import annotations

import numpy as np
import torch

from packer.contract.names import IGNORE_INDEX
from packer.torch.collate import model_inputs
from packer.torch.isolation import IsolationError, check_isolation

# what the documented configuration needs, named in every error
RECIPE = (
    'SFTConfig(padding_free=True, max_length=None, dataset_kwargs={"skip_prepare_dataset": '
    "True}, remove_unused_columns=False)"
)
# packer's rows as a trainer loads them: the TRL export (seq_lengths) or the shards themselves
# (`load_hf_dataset`, cu_seqlens), with their provenance
EXPORT_COLUMNS = ("input_ids", "sample_index")
BOUNDARY_COLUMNS = ("seq_lengths", "cu_seqlens")


class TrainerCheckError(ValueError):
    """The trainer would train packer's rows without their sample boundaries."""


def check_trainer(trainer, *, dataset=None, model_check: bool = True, max_samples: int = 16):
    """Raise `TrainerCheckError` unless the trainer's next batch keeps packer's samples apart.

    `dataset` is packer's TRL export (`datasets.load_from_disk`); by default the trainer's own
    `train_dataset`, which must still be the export as written (TRL leaves it so only with
    `skip_prepare_dataset`). `model_check` also runs `trainer.model` on the batch and on up to
    `max_samples` of its samples alone. Returns the batch's sample count.
    """
    dataset = trainer.train_dataset if dataset is None else dataset
    _check_export(dataset)  # before drawing: a re-packed dataset is named as such
    batch = next(iter(trainer.get_train_dataloader()))
    model = trainer.model if model_check else None
    return check_batch(batch, dataset, model, max_samples=max_samples)


def check_batch(batch: dict, dataset, model=None, *, max_samples: int = 16) -> int:
    """`check_trainer` on a batch already drawn from the trainer's dataloader."""
    _check_export(dataset)
    rows = _RowIndex(dataset)
    positions = batch.get("position_ids")
    if batch.get("attention_mask") is not None or positions is None:
        raise TrainerCheckError(
            "the trainer's collator hands the model an attention_mask (or no position_ids): "
            "each packed row trains as one sequence, its samples attending to each other "
            f"(TRL's default padding_free=False). Set padding_free=True: {RECIPE}"
        )
    ids, positions = batch["input_ids"].cpu().numpy(), positions.cpu().numpy()
    samples = 0
    for r in range(ids.shape[0]):
        want = rows.positions_of(ids[r], r)
        got = positions[r, : want.size]
        bad = np.flatnonzero(got != want)
        if bad.size:
            t = int(bad[0])
            raise TrainerCheckError(
                f"batch row {r}, token {t}: position {int(got[t])}, but packer's samples give "
                f"{int(want[t])}: positions do not restart at packer's sample boundaries, so "
                "samples attend to each other (TRL re-packed the rows: packing=True without "
                f'dataset_kwargs={{"skip_prepare_dataset": True}}). Use {RECIPE}'
            )
        samples += int((want == 0).sum())
    if not _first_labels_ignored(batch):
        raise TrainerCheckError(
            "a sample's first label counts: the last token of the sample before it is trained "
            "to predict it. TRL's padding-free collator masks it; use its collator, or mask "
            "labels where position_ids is 0"
        )
    if model is not None:
        _check_model(model, batch, max_samples)
    return samples


def _check_export(dataset) -> None:
    if not hasattr(dataset, "data") or not hasattr(dataset, "column_names"):
        raise TrainerCheckError(
            f"dataset must be a datasets.Dataset of packer's rows, got {type(dataset).__name__}"
        )
    names = dataset.column_names
    missing = [c for c in EXPORT_COLUMNS if c not in names]
    if not any(c in names for c in BOUNDARY_COLUMNS):
        missing.append("seq_lengths")
    if missing:
        raise TrainerCheckError(
            f"the trainer's train_dataset has no {', '.join(missing)} column: it is not packer's "
            "TRL export as written. TRL prepared it (packing=True, or a max_length, without "
            'dataset_kwargs={"skip_prepare_dataset": True}), re-packing or cutting whole rows '
            f"and dropping packer's sample boundaries. Use {RECIPE}, or pass dataset= (the "
            "export) to check the batch against it"
        )


PREFIX = 32  # rows are found by a hash of their first tokens (all start with BOS, say)
_POWERS = np.full(PREFIX, 0x100000001B3, np.uint64) ** np.arange(PREFIX, dtype=np.uint64)


def _prefix_hash(tokens: np.ndarray, k: np.ndarray) -> np.ndarray:
    """A 64-bit hash of the first k[i] tokens of each row of `tokens` ([rows, PREFIX])."""
    keep = np.arange(PREFIX)[None, :] < k[:, None]
    t = np.where(keep, tokens.astype(np.int64) + 1, 0).astype(np.uint64)
    with np.errstate(over="ignore"):
        return (t * _POWERS).sum(axis=1, dtype=np.uint64) ^ k.astype(np.uint64)


class _RowIndex:
    """packer's export rows, found by their tokens: which rows a batch row concatenates."""

    def __init__(self, dataset, block: int = 1 << 16):
        self.dataset = dataset
        hashes, lengths = [], []
        for chunk in dataset.data.column("input_ids").chunks:  # memory-mapped: read in place
            off = chunk.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
            values = chunk.values.to_numpy(zero_copy_only=False)
            for a in range(0, off.size - 1, block):  # [block, PREFIX] at a time
                n = np.diff(off[a : a + block + 1])
                start = off[a : a + n.size]
                at = np.minimum(start[:, None] + np.arange(PREFIX), max(values.size - 1, 0))
                heads = values[at] if values.size else np.zeros(at.shape, np.int64)
                hashes.append(_prefix_hash(heads, np.minimum(n, PREFIX)))
                lengths.append(n)
        h = np.concatenate(hashes) if hashes else np.zeros(0, np.uint64)
        length = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
        indices = getattr(dataset, "_indices", None)  # a select() or shuffle() of the rows
        if indices is not None:
            order = indices.column(0).to_numpy(zero_copy_only=False).astype(np.int64)
            h, length = h[order], length[order]
        self.rows = np.flatnonzero(length > 0)  # dataset row numbers
        self.by_hash = np.argsort(h[self.rows], kind="stable")
        self.sorted_hash = h[self.rows][self.by_hash]
        self.prefixes = np.unique(np.minimum(length[self.rows], PREFIX))  # PREFIX, and shorter

    def _candidates(self, tokens: np.ndarray) -> np.ndarray:
        """The rows whose first tokens are those of `tokens`."""
        k = self.prefixes[self.prefixes <= tokens.size]
        if not k.size:
            return np.zeros(0, np.int64)
        head = np.zeros((k.size, PREFIX), np.int64)
        head[:, : min(PREFIX, tokens.size)] = tokens[:PREFIX]
        found = []
        for h in _prefix_hash(head, k):
            lo = np.searchsorted(self.sorted_hash, h, "left")
            hi = np.searchsorted(self.sorted_hash, h, "right")
            found.append(self.rows[self.by_hash[lo:hi]])
        return np.concatenate(found)

    def positions_of(self, tokens: np.ndarray, r: int) -> np.ndarray:
        """The position ids packer's samples give a batch row made of whole export rows; its
        padding (what no row matches at its end) is left out."""
        out, p = [], 0
        while p < tokens.size:
            match = None
            for i in self._candidates(tokens[p:]):
                row = self.dataset[int(i)]
                n = len(row["input_ids"])
                fits = n <= tokens.size - p and np.array_equal(tokens[p : p + n], row["input_ids"])
                if fits and (match is None or n > len(match["input_ids"])):
                    match = row  # the longest row that fits, should one be another's prefix
            if match is None:
                if out:  # the row's padding: the collator's pad tokens after whole rows
                    break
                raise TrainerCheckError(
                    f"batch row {r}, token {p}: these tokens are not a row of packer's export: "
                    "the trainer cut or re-packed the rows (a max_length, or packing=True, "
                    f'without dataset_kwargs={{"skip_prepare_dataset": True}}). Use {RECIPE}'
                )
            out += [np.arange(n) for n in _sample_lengths(match)]
            p += len(match["input_ids"])
        return np.concatenate(out) if out else np.zeros(0, np.int64)


def _sample_lengths(row: dict) -> list[int]:
    """The sample lengths of one of packer's rows: its seq_lengths (TRL export) or the
    segments of its cu_seqlens (packer's shards; a --pad row's padding segment included)."""
    if "seq_lengths" in row:
        return list(row["seq_lengths"])
    return np.diff(np.asarray(row["cu_seqlens"])).tolist()


def _check_model(model, batch: dict, max_samples: int) -> None:
    """The trainer's model on the batch and on each sample alone (`check_isolation`)."""
    positions = batch["position_ids"]
    if not bool((positions[:, 1:] == 0).any()):
        return  # one sample per row cannot show a leak
    batch, forward = dict(batch), None
    if "cu_seq_lens_q" not in batch and "cu_seqlens" not in batch:
        if positions.shape[0] != 1:
            return  # per-row boundaries without cu_seqlens: no alone batches to compare with
        # TRL before 1.16 sends position_ids alone
        starts = torch.nonzero(positions[0] == 0).flatten()
        cu = torch.cat([starts, torch.tensor([positions.shape[1]])]).to(torch.int32)
        batch["cu_seq_lens_q"] = cu  # where the samples are, for check_isolation only

        def forward(model, b):  # the model gets what the trainer gives it, no boundaries
            keys = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
            return model(**{k: v for k, v in model_inputs(b).items() if k not in keys})

    try:
        check_isolation(model, batch, forward=forward, max_samples=max_samples, pad_id=0)
    except IsolationError as exc:
        raise TrainerCheckError(
            f"the trainer's model lets packed samples see each other: {exc}. Load it with an "
            "attention that reads position_ids or cu_seq_lens (flash_attention_2, or sdpa / "
            "eager with use_cache=False, which SFTTrainer passes)"
        ) from exc


def _first_labels_ignored(batch: dict) -> bool:
    """Every sample's first label is -100 (TRL's padding-free collator masks it)."""
    starts = batch["position_ids"] == 0
    return bool((batch["labels"][starts] == IGNORE_INDEX).all())

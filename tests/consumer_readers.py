"""Run inside `.venv-readers` (scripts/readers_venv.py): the trainers' own readers, dumped as
JSON for tests/test_export.py. Nothing here is packer's code.

    python consumer_readers.py megatron PREFIX          -> Megatron-LM's IndexedDataset
    python consumer_readers.py mds DIR                  -> streaming's StreamingDataset
    python consumer_readers.py mds-write ROWS.json DIR LIMIT -> streaming's own MDSWriter
    python consumer_readers.py megatron-merge VOCAB DIR PREFIX -> megatron-core's builder merges
        a dataset of its own (dtype as preprocess_data.py picks it for VOCAB) with PREFIX
    python consumer_readers.py bridge DIR SIZE EOS MULT PAD_CU -> Megatron-Bridge's packed
        Parquet dataset and collate_fn, one row per micro-batch
    python consumer_readers.py bridge-recipe CODE DIR EOS -> the same, with the dataset config
        that docs/export.md's recipe (the file CODE) sets, run in DIR
    python consumer_readers.py megatron-recipe CODE DIR -> docs/export.md's IndexedDataset block
    python consumer_readers.py mds-recipe CODE DIR -> docs/export.md's streaming loader block
    python consumer_readers.py gpt-dataset PREFIX SEQLEN EOD EOD_MASK N -> Megatron-LM's
        pretraining GPTDataset with inter_document_masking (--dataloader-inter-document-masking)
    python consumer_readers.py mds-loader DIR BATCH -> streaming's StreamingDataset in a torch
        DataLoader with packer.torch.collate_packed, and check_isolation on a tiny model

Packages entered without their `__init__` (each imports the CUDA-only stack: triton,
transformer-engine, every model bridge), the modules below them unchanged: megatron.core,
megatron.training, megatron.bridge and its data, data.datasets, data.builders, training,
training.tokenizers and utils. Modules stubbed, imported but never called (each stub raises if
it is): megatron.bridge.utils.common_utils (rank and logging helpers, and `resolve_path`) and
megatron.bridge.training.tokenizers.tokenizer (`MegatronTokenizer`, a type annotation here).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types


def _streaming_base():
    # `import streaming` runs streaming/__init__.py, which imports streaming.vision and with it
    # torchvision, which has no wheel for the CPU torch here; the package is entered without
    # that file, and every module below is streaming's own, unchanged.
    spec = importlib.util.find_spec("streaming")
    package = types.ModuleType("streaming")
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules["streaming"] = package
    import streaming.base

    return streaming.base


def _bare(*names: str) -> None:
    """Each package as a module with its path but without running its `__init__`."""
    import megatron  # noqa: F401  the namespace package they live in

    for name in names:
        parent, leaf = name.rsplit(".", 1)
        package = types.ModuleType(name)
        package.__path__ = [f"{p}/{leaf}" for p in sys.modules[parent].__path__]
        sys.modules[name] = package


class _NotCalled:
    """A stubbed name: importing it works, calling it fails the reader."""

    def __init__(self, *args, **kwargs):
        raise AssertionError(f"a stub was called: {type(self).__name__}")


def _megatron_core() -> None:
    # megatron/core/__init__.py imports its distributed and pipeline code, which needs triton
    if "megatron.core" not in sys.modules:
        _bare("megatron.core")
        # what its __init__ imports first: parallel_state and utils import each other
        import megatron.core.parallel_state  # noqa: F401


def _bridge():
    _megatron_core()
    _bare(
        "megatron.training",
        "megatron.bridge",
        "megatron.bridge.data",
        "megatron.bridge.data.datasets",
        "megatron.bridge.data.builders",
        "megatron.bridge.training",
        "megatron.bridge.training.tokenizers",
        "megatron.bridge.utils",
    )
    stubs = {
        "megatron.bridge.utils.common_utils": (
            "get_local_rank_preinit",
            "get_rank_safe",
            "get_world_size_safe",
            "print_rank_0",
            "get_last_rank",
            "resolve_path",
        ),
        "megatron.bridge.training.tokenizers.tokenizer": ("MegatronTokenizer",),
    }
    for module, names in stubs.items():
        stub = types.ModuleType(module)
        for name in names:
            setattr(stub, name, type(name, (_NotCalled,), {}))
        sys.modules[module] = stub
    from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split

    return build_gpt_sft_split


class _EosTokenizer:
    """What the packed dataset and its collate read of a tokenizer: the EOS id."""

    def __init__(self, eos_id: int):
        self.eos_id = eos_id


def bridge(directory: str, size: str, eos: str, mult: str, pad_cu: str) -> dict:
    """docs/export.md's recipe as Bridge's config classes (GPTSFTDatasetConfig with
    PackedSequenceSpecs, validated), then the training split as GPTSFTDatasetBuilder builds
    it from them (`build_gpt_sft_split`, with its `_build_datasets` arguments) and the
    dataset's collate_fn, one row per micro-batch (micro_batch_size 1)."""
    build = _bridge()
    from megatron.bridge.data.builders.gpt_sft import GPTSFTDatasetConfig
    from megatron.bridge.data.packing import PackedSequenceSpecs

    pad_cu_seqlens = pad_cu == "1"
    config = GPTSFTDatasetConfig(
        seq_length=int(size),
        dataset_root=directory,
        enable_offline_packing=True,
        offline_packing_specs=PackedSequenceSpecs(
            packed_sequence_size=int(size),
            packed_train_data_path=directory,
            packed_metadata_path=f"{directory}/packing_metadata.json",
            pad_seq_to_mult=int(mult),
            pad_cu_seqlens=pad_cu_seqlens,
        ),
        dataset_kwargs={"pad_to_max_length": True} if pad_cu_seqlens else None,
        do_validation=False,
        do_test=False,
    )
    return _bridge_batches(build, config, int(eos))


def bridge_recipe(code_file: str, directory: str, eos: str) -> dict:
    """docs/export.md's recipe block run as written, in DIRECTORY (where its paths lead to
    the export), on a `cfg` with the attributes it sets; then the data path of `bridge`."""
    import os

    build = _bridge()
    cfg = types.SimpleNamespace(train=types.SimpleNamespace(), model=types.SimpleNamespace())
    with open(code_file) as fh:
        code = fh.read()
    os.chdir(directory)
    exec(compile(code, "docs/export.md", "exec"), {"cfg": cfg})  # noqa: S102
    out = _bridge_batches(build, cfg.dataset, int(eos))
    out["micro_batch_size"] = cfg.train.micro_batch_size
    return out


def _bridge_batches(build, config, eos: int) -> dict:
    """The training split as GPTSFTDatasetBuilder builds it from `config` (validated), and the
    dataset's collate_fn on one row per micro-batch."""
    from megatron.bridge.data.builders.gpt_sft import normalize_gpt_sft_dataset_kwargs

    config.validate()
    specs = config.offline_packing_specs
    ds = build(
        specs.packed_train_data_path,
        tokenizer=_EosTokenizer(eos),
        seq_length=config.seq_length,
        memmap_workers=config.memmap_workers,
        seed=config.seed,
        packed_sequence_size=specs.packed_sequence_size,
        pack_metadata_path=specs.packed_metadata_path,
        pad_cu_seqlens=specs.pad_cu_seqlens,
        pad_seq_to_mult=specs.pad_seq_to_mult,
        dataset_kwargs={
            "max_num_samples": config.max_train_samples,
            **normalize_gpt_sft_dataset_kwargs(config),
        },
    )
    batches = []
    for i in range(len(ds)):
        batch = ds.collate_fn([ds[i]])
        item = {key: value for key, value in batch.items() if value is not None}
        for key, value in item.items():
            if key.startswith("max_seqlen"):  # [1] with pad_cu_seqlens, else [1, 1]
                item[key] = int(value.reshape(-1)[0])
            else:
                item[key] = value[0].tolist() if hasattr(value, "tolist") else value[0]
        batches.append(item)
    return {"class": type(ds).__name__, "rows": len(ds), "batches": batches}


def megatron(prefix: str) -> dict:
    _megatron_core()
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    out = {}
    for name in ("input_ids", "labels"):
        ds = IndexedDataset(f"{prefix}/{name}")
        out[name] = [ds[i].tolist() for i in range(len(ds))]
        out[f"{name}_dtype"] = ds.index.dtype.__name__
        out["document_indices"] = ds.document_indices.tolist()
    return out


def megatron_recipe(code_file: str, directory: str) -> dict:
    """docs/export.md's IndexedDataset block run as written in DIRECTORY; its rows' sequences."""
    import os

    _megatron_core()
    with open(code_file) as fh:
        code = fh.read()
    os.chdir(directory)
    namespace: dict = {}
    exec(compile(code, "docs/export.md", "exec"), namespace)  # noqa: S102
    tokens, labels, rows = namespace["tokens"], namespace["labels"], namespace["rows"]
    return {
        "rows": [
            [[tokens[i].tolist(), labels[i].tolist()] for i in range(rows[r], rows[r + 1])]
            for r in range(len(rows) - 1)
        ]
    }


class _EodTokenizer:
    """What GPTDataset reads of a tokenizer: the EOD and pad ids, the vocabulary size and an
    identifier for its cache."""

    def __init__(self, eod: int):
        self.eod, self.pad, self.vocab_size = eod, -1, 32000
        self.unique_identifiers = {"class": "EodTokenizer", "eod": eod}


def gpt_dataset(prefix: str, seqlen: str, eod: str, eod_mask: str, count: str) -> dict:
    """The first COUNT training windows of Megatron-LM's GPTDataset over PREFIX, as
    BlendedMegatronDatasetBuilder builds it for `--data-path PREFIX --split 1,0,0
    --dataloader-inter-document-masking` (and `--eod-mask-loss` when EOD_MASK is 1), with the
    documents (IndexedDataset sequences) each window was cut from."""
    import tempfile

    _megatron_core()
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    config = GPTDatasetConfig(
        random_seed=1234,
        sequence_length=int(seqlen),
        blend=([prefix], None),
        split="1,0,0",
        tokenizer=_EodTokenizer(int(eod)),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=eod_mask == "1",
        create_attention_mask=False,
        inter_document_masking=True,
        path_to_cache=tempfile.mkdtemp(),
    )
    train, _, _ = BlendedMegatronDatasetBuilder(
        GPTDataset, [int(count), None, None], lambda: True, config
    ).build()
    windows = []
    for i in range(int(count)):
        item = train[i]
        _, documents, _ = train._query_document_sample_shuffle_indices(i)
        cu = item["cu_seqlens"].tolist()
        windows.append(
            {
                "tokens": item["tokens"].tolist(),
                "labels": item["labels"].tolist(),
                "loss_mask": item["loss_mask"].tolist(),
                "position_ids": item["position_ids"].tolist(),
                "cu_seqlens": cu[: cu.index(int(seqlen)) + 1],
                "max_seqlen": int(item["max_seqlen"]),
                "documents": documents.tolist(),
            }
        )
    return {"windows": windows, "documents": len(train.document_index)}


def megatron_merge(vocab: str, directory: str, prefix: str) -> dict:
    """What Megatron-LM's tools/merge_datasets.py does: one IndexedDatasetBuilder, `add_index`
    for each dataset, `finalize`; the first dataset is made as tools/preprocess_data.py makes
    one for a tokenizer of VOCAB ids."""
    import numpy as np
    import torch

    _megatron_core()
    from megatron.core.datasets.indexed_dataset import DType, IndexedDataset, IndexedDatasetBuilder

    dtype = DType.optimal_dtype(int(vocab))
    theirs = f"{directory}/theirs"
    builder = IndexedDatasetBuilder(f"{theirs}.bin", dtype=dtype)
    for document in ([5, 6, 7], [8, 9]):
        builder.add_document(torch.tensor(document), [len(document)])
    builder.finalize(f"{theirs}.idx")
    merged = f"{directory}/merged"
    builder = IndexedDatasetBuilder(f"{merged}.bin", dtype=dtype)
    try:
        for part in (theirs, prefix):
            builder.add_index(part)
    except AssertionError:  # megatron-core's own check: `index.dtype == self.dtype`
        return {"merged": False, "dtype": np.dtype(dtype).name}
    builder.finalize(f"{merged}.idx")
    ds = IndexedDataset(merged)
    return {
        "merged": True,
        "dtype": np.dtype(dtype).name,
        "sequences": [ds[i].tolist() for i in range(len(ds))],
        "document_indices": ds.document_indices.tolist(),
    }


def mds(directory: str) -> list[dict]:
    base = _streaming_base()
    ds = base.StreamingDataset(local=directory, shuffle=False, batch_size=1, validate_hash="xxh64")
    return [{k: v.tolist() for k, v in ds[i].items()} for i in range(len(ds))]


def mds_loader(directory: str, batch_size: str) -> dict:
    """What a PyTorch (or Composer) training loop gets from an MDS export: StreamingDataset's
    rows, batched by torch's DataLoader with packer's collate (flatten), and whether a tiny
    model gives every sample of the first batch what it gives the sample alone."""
    import torch

    from packer.torch import check_isolation, collate_packed
    from packer.torch.tiny_model import build_tiny_model

    base = _streaming_base()
    ds = base.StreamingDataset(
        local=directory, shuffle=False, batch_size=int(batch_size), validate_hash="xxh64"
    )
    loader = torch.utils.data.DataLoader(
        ds, batch_size=int(batch_size), collate_fn=collate_packed, num_workers=0
    )
    batches = []
    for batch in loader:
        batches.append(
            {
                key: value.tolist() if isinstance(value, torch.Tensor) else value
                for key, value in batch.items()
            }
        )
    first = next(iter(loader))
    report = check_isolation(build_tiny_model(), first)
    return {"batches": batches, "isolated": report.ok, "samples": report.samples_after_first}


def mds_recipe(code_file: str, directory: str) -> dict:
    """docs/export.md's streaming loader block run as written in DIRECTORY (where its path leads
    to the export), with `model` a tiny transformers model; `streaming.StreamingDataset` is
    streaming.base's, which the package's `__init__` exports."""
    import os

    from packer.torch.tiny_model import build_tiny_model

    base = _streaming_base()
    sys.modules["streaming"].StreamingDataset = base.StreamingDataset
    with open(code_file) as fh:
        code = fh.read()
    os.chdir(directory)
    namespace = {"model": build_tiny_model()}
    exec(compile(code, "docs/export.md", "exec"), namespace)  # noqa: S102
    batch, outputs = namespace["batch"], namespace["outputs"]
    return {
        "input_ids": batch["input_ids"].tolist(),
        "cu_seq_lens_q": batch["cu_seq_lens_q"].tolist(),
        "logits_shape": list(outputs.logits.shape),
    }


def mds_write(rows_json: str, directory: str, limit: str) -> None:
    import numpy as np

    base = _streaming_base()
    with open(rows_json) as fh:
        rows = json.load(fh)
    dtypes = {"input_ids": np.uint32, "sample_index": np.int64}
    columns = {name: f"ndarray:{np.dtype(dtypes.get(name, np.int32)).name}" for name in rows[0]}
    with base.MDSWriter(
        columns=columns, out=directory, hashes=["xxh64"], size_limit=int(limit)
    ) as writer:
        for row in rows:
            writer.write({k: np.array(v, dtypes.get(k, np.int32)) for k, v in row.items()})


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "mds-write":
        mds_write(*args)
    else:
        readers = {
            "megatron": megatron,
            "mds": mds,
            "megatron-merge": megatron_merge,
            "bridge": bridge,
            "bridge-recipe": bridge_recipe,
            "mds-loader": mds_loader,
            "mds-recipe": mds_recipe,
            "gpt-dataset": gpt_dataset,
            "megatron-recipe": megatron_recipe,
        }
        json.dump(readers[command](*args), sys.stdout)

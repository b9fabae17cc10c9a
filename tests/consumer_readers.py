"""Run inside `.venv-readers` (scripts/readers_venv.py): the trainers' own readers, dumped as
JSON for tests/test_export.py. Nothing here is packer's code.

    python consumer_readers.py megatron PREFIX          -> Megatron-LM's IndexedDataset
    python consumer_readers.py mds DIR                  -> streaming's StreamingDataset
    python consumer_readers.py mds-write ROWS.json DIR LIMIT -> streaming's own MDSWriter
    python consumer_readers.py megatron-merge VOCAB DIR PREFIX -> megatron-core's builder merges
        a dataset of its own (dtype as preprocess_data.py picks it for VOCAB) with PREFIX
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


def megatron(prefix: str) -> dict:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    out = {}
    for name in ("input_ids", "labels"):
        ds = IndexedDataset(f"{prefix}/{name}")
        out[name] = [ds[i].tolist() for i in range(len(ds))]
        out[f"{name}_dtype"] = ds.index.dtype.__name__
        out["document_indices"] = ds.document_indices.tolist()
    return out


def megatron_merge(vocab: str, directory: str, prefix: str) -> dict:
    """What Megatron-LM's tools/merge_datasets.py does: one IndexedDatasetBuilder, `add_index`
    for each dataset, `finalize`; the first dataset is made as tools/preprocess_data.py makes
    one for a tokenizer of VOCAB ids."""
    import numpy as np
    import torch
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
        readers = {"megatron": megatron, "mds": mds, "megatron-merge": megatron_merge}
        json.dump(readers[command](*args), sys.stdout)

"""`cp_shard` on a batch that lives on the GPU, and the device of every tensor it returns: the
attention kwargs go to CUDA kernels (docs/context-parallel.md), so they must be where the
tokens are. Without a GPU: a tensor that refuses `.numpy()` as a CUDA tensor does, and the
`meta` device as the target; with one, the real thing."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from packer.torch import cp_shard  # noqa: E402


def cp_batch() -> dict:
    """A flatten batch of samples with 5 and 3 real tokens, padded to 8 and 4 (cp_size 2)."""
    real, padded = [0, 5, 8], [0, 8, 12]
    ids = torch.arange(100, 112)[None]
    labels = ids.clone()
    labels[0, [0, 5, 6, 7, 8, 11]] = -100
    return {
        "input_ids": ids,
        "labels": labels,
        "position_ids": torch.tensor([list(range(8)) + list(range(4))]),
        "cu_seqlens": torch.tensor(real, dtype=torch.int32),
        "cu_seqlens_padded": torch.tensor(padded, dtype=torch.int32),
        "cu_seq_lens_q": torch.tensor(padded, dtype=torch.int32),
        "num_loss_tokens": torch.tensor(4),
    }


def tensors(shard: dict) -> dict:
    """Every tensor of a shard, the kernels' kwargs included, by name."""
    out = {k: v for k, v in shard.items() if isinstance(v, torch.Tensor)}
    for group in ("te_kwargs", "ring_flash_attn_kwargs"):
        out.update({f"{group}.{k}": v for k, v in shard[group].items() if torch.is_tensor(v)})
    return out


class OnGpu(torch.Tensor):
    """A tensor that behaves as a CUDA one for `.numpy()`: refused until `.cpu()`."""

    def numpy(self, *args, **kwargs):
        raise TypeError("can't convert cuda:0 device type tensor to numpy")

    def cpu(self, *args, **kwargs):
        return self.as_subclass(torch.Tensor)


def test_shard_follows_the_batch_device_by_default():
    shard = cp_shard(cp_batch(), 0, 2)
    assert {str(t.device) for t in tensors(shard).values()} == {"cpu"}
    assert set(tensors(shard)) >= {
        "te_kwargs.cu_seqlens_q",
        "te_kwargs.cu_seqlens_kv_padded",
        "ring_flash_attn_kwargs.cu_seqlens",
    }


def test_a_batch_that_cannot_become_numpy_is_split():
    """A batch on the GPU: the zigzag index is computed from a CPU copy of its boundaries."""
    batch = cp_batch()
    gpu = {k: v.as_subclass(OnGpu) if torch.is_tensor(v) else v for k, v in batch.items()}
    with pytest.raises(TypeError, match="numpy"):
        gpu["cu_seqlens_padded"].numpy()
    for rank in range(2):
        want, got = tensors(cp_shard(batch, rank, 2)), tensors(cp_shard(gpu, rank, 2))
        assert set(got) == set(want)
        for name, tensor in want.items():
            assert torch.equal(got[name].as_subclass(torch.Tensor), tensor), name


def test_every_tensor_goes_to_the_device_asked_for():
    shard = cp_shard(cp_batch(), 1, 2, device="meta")
    assert {t.device.type for t in tensors(shard).values()} == {"meta"}
    assert shard["te_kwargs"]["max_seqlen_q"] == 8 and shard["local_loss_tokens"] == 3
    assert shard["ring_flash_attn_kwargs"]["max_seqlen"] == 4  # ints stay Python ints


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_batch_on_the_gpu_gives_a_shard_on_the_gpu():
    batch = cp_batch()
    on_gpu = {k: v.cuda() if torch.is_tensor(v) else v for k, v in batch.items()}
    for rank in range(2):
        want, got = tensors(cp_shard(batch, rank, 2)), tensors(cp_shard(on_gpu, rank, 2))
        for name, tensor in want.items():
            assert got[name].is_cuda and torch.equal(got[name].cpu(), tensor), name
    split = tensors(cp_shard(batch, 0, 2, device="cuda"))
    assert all(t.is_cuda for t in split.values())

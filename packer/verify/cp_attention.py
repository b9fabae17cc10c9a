"""The `cp_attention` check: context-parallel ranks simulated on the CPU, ring pass by ring pass.

For each picked row that splits for `cp_size` N, every rank takes its zigzag share of q/k/v
(`packer.planning.cp.zigzag_index`, what `packer.torch.cp_shard` hands out) and runs ring
attention as the CP kernels do: N steps, each a partial causal softmax attention of the rank's
queries over the key/value block the ring brings (its own first, then rank r - 1's, ...),
merged by a running log-sum-exp. Every rank attends sample by sample (each sample's slots on
a rank are `cu_seqlens_padded // N`, ring-flash-attn's local cu_seqlens), causal by the
positions the zigzag layout gives its slots, as a real kernel derives them; padding keys are
attended like real ones (ring-flash-attn's way).
The ranks' outputs, put back into row order, must equal each sample's causal attention run
alone over its real tokens (fp32). Samples are delimited by the position restarts, not by the
boundaries the ranks use, so a boundary in the wrong place shows.

Two negative controls run the same simulation with a fault planted: one rank's key/value chunk
of a sample exchanged with another sample's (`chunk_exchange`), and ranks holding chunks r and
r + N instead of 2N - 1 - r while the kernel assumes zigzag (`wrong_zigzag`). Each must move
the samples by more than 10x the tolerance, or the check could not have seen such a fault and
fails. Torch is imported inside the functions only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from packer.contract.shards import ShardArrays
from packer.planning.cp import zigzag_index
from packer.verify.attention import LEAK_FACTOR, TOLERANCE, qkv_from_tokens, reference_attention
from packer.verify.memory import block_scores, budget_bytes
from packer.verify.picked_rows import (
    RowInput,
    alone_segments,
    pick_rows,
    sample_failure,
    sample_label,
)
from packer.verify.result import CheckResult, Failure
from packer.verify.row_checks import RowStatus

TOL = TOLERANCE["fp32"]
THRESHOLD = LEAK_FACTOR * TOL


def token_layout(cu_padded: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(segment, position within the segment) of every row position, from the boundaries."""
    cu = np.asarray(cu_padded, np.int64)
    t = np.arange(int(cu[-1]), dtype=np.int64)
    seg = np.searchsorted(cu[1:], t, side="right")
    return seg, t - cu[seg]


QUERY_BLOCK_SCORES = 1 << 22  # scores held at once per head: long rows go in query blocks


def _partial(q, k, v, pos_q, pos_k, scores: int | None = None):
    """Causal softmax attention of one sample's queries over its keys at positions <= their
    own: (out (Tq, H, D), lse (Tq, H)). A query allowed no key gets out 0 and lse -inf, which
    the merge ignores."""
    import torch

    outs, lses = [], []
    limit = QUERY_BLOCK_SCORES if scores is None else min(scores, QUERY_BLOCK_SCORES)
    block = max(1, limit // max(1, k.shape[0]))
    for s in range(0, q.shape[0], block):
        allowed = pos_k[None, :] <= pos_q[s : s + block, None]
        scores = torch.einsum("qhd,khd->hqk", q[s : s + block], k) * q.shape[-1] ** -0.5
        scores = scores.masked_fill(~allowed, float("-inf"))
        top = scores.amax(dim=-1, keepdim=True)
        weights = torch.exp(scores - top.masked_fill(top == float("-inf"), 0.0))
        total = weights.sum(dim=-1)  # 0 where no key is allowed: out 0, lse -inf
        out = torch.einsum("hqk,khd->qhd", weights, v) / total.clamp_min(1e-30).T[..., None]
        outs.append(out)
        lses.append((top[..., 0] + torch.log(total)).transpose(0, 1))
    return torch.cat(outs), torch.cat(lses)


def _merge(out, lse, out_b, lse_b):
    """Two partial attentions of the same queries as one (the ring's running LSE merge)."""
    import torch

    new = torch.logaddexp(lse, lse_b)
    w_a = torch.exp(lse - new).nan_to_num(0.0)[..., None]
    w_b = torch.exp(lse_b - new).nan_to_num(0.0)[..., None]
    return out * w_a + out_b * w_b, new


def ring_attention(
    q,
    k,
    v,
    cu_padded: np.ndarray,
    cp_size: int,
    second_chunk: Callable[[int], int] | None = None,
    kv_perm: dict[int, np.ndarray] | None = None,
    scores: int | None = None,
):
    """Causal attention of a row (q, k, v of shape (T, H, D)) computed as `cp_size` ring ranks
    would, returned in row order. Like a varlen CP kernel, every rank holds each sample's slots
    at `cu_padded // cp_size` (ring-flash-attn's local cu_seqlens) and masks by the positions
    the zigzag layout gives them. The negative controls plant their faults with
    `second_chunk(rank)` (the second chunk a rank really holds, the kernel still assuming
    zigzag) and `kv_perm` (rank -> a permutation of the local key/value slots it sends).
    `scores`: the most scores per head one partial attention holds (QUERY_BLOCK_SCORES at most)."""
    import torch

    _, pos = token_layout(cu_padded)
    local_cu = (np.asarray(cu_padded, np.int64) // cp_size).tolist()
    held, queries, blocks = [], [], []
    for r in range(cp_size):
        other = None if second_chunk is None else second_chunk(r)
        index = zigzag_index(cu_padded, r, cp_size, other)  # where the rank's tokens come from
        assumed = torch.from_numpy(pos[zigzag_index(cu_padded, r, cp_size)])  # kernel's view
        kv = torch.from_numpy(index if kv_perm is None or r not in kv_perm else index[kv_perm[r]])
        held.append(torch.from_numpy(index))
        queries.append((q[held[-1]], assumed))
        blocks.append((k[kv], v[kv], assumed))
    out = torch.zeros_like(q)
    for r, (q_r, pos_q) in enumerate(queries):
        acc = torch.zeros_like(q_r)
        lse = torch.full(q_r.shape[:2], float("-inf"), dtype=q.dtype)
        for step in range(cp_size):  # step s brings the block of rank r - s
            k_b, v_b, pos_k = blocks[(r - step) % cp_size]
            for a, b in zip(local_cu, local_cu[1:]):  # sample by sample, as varlen kernels go
                if b == a:
                    continue
                part = _partial(q_r[a:b], k_b[a:b], v_b[a:b], pos_q[a:b], pos_k[a:b], scores)
                acc[a:b], lse[a:b] = _merge(acc[a:b], lse[a:b], *part)
        out[held[r]] = acc
    return out


@dataclass
class RingRow:
    """A row to simulate: its tokens, position ids, padded boundaries and real lengths."""

    item: RowInput | None  # None: the synthetic control row
    ids: np.ndarray
    positions: np.ndarray
    cu_padded: np.ndarray
    real: np.ndarray  # real tokens of each segment of cu_padded
    samples: int  # the segments that are samples (the rest: the row's padding)


def ring_row(shard: ShardArrays, r: int) -> RingRow:
    data = shard.row(r)
    cu = np.asarray(data["cu_seqlens"], np.int64)
    real = np.diff(cu)
    if shard.cu_real is not None:
        cur = shard.cu_real[int(shard.cu_real_off[r]) : int(shard.cu_real_off[r + 1])]
        if cur.size == cu.size:
            real = np.minimum(real, np.diff(cur.astype(np.int64)))
    item = RowInput(shard.name, shard.shard_row(r), data)
    ids, positions = np.asarray(data["input_ids"]), np.asarray(data["position_ids"])
    return RingRow(item, ids, positions, cu, real, len(data["sample_index"]))


def synthetic_row(cp_size: int) -> RingRow:
    """Two fully real samples of 4N tokens each: a row every control can be planted in."""
    n = 4 * cp_size
    cu = np.array([0, n, 2 * n], np.int64)
    positions = np.concatenate([np.arange(n), np.arange(n)])
    return RingRow(None, np.arange(2 * n), positions, cu, np.array([n, n]), 2)


def wrong_zigzag(row: RingRow, cp_size: int, k) -> dict | None:
    """Ranks hold chunks r and r + N; None when no real token moves (nothing to see)."""
    seg, pos = token_layout(row.cu_padded)
    real = pos < row.real[seg]
    for r in range(cp_size):
        wrong = zigzag_index(row.cu_padded, r, cp_size, r + cp_size)
        if np.any(real[wrong] & (wrong != zigzag_index(row.cu_padded, r, cp_size))):
            return {"second_chunk": lambda rank: rank + cp_size}
    return None


def chunk_exchange(row: RingRow, cp_size: int, k) -> dict | None:
    """Rank 0 sends sample A's first chunk of keys/values in place of sample B's and back
    (the first pair whose keys differ there); None when the row holds no such pair."""
    import torch

    chunk = np.diff(row.cu_padded) // (2 * cp_size)
    start = np.concatenate([[0], np.cumsum(2 * chunk)])  # each segment's slots on rank 0
    local = torch.from_numpy(zigzag_index(row.cu_padded, 0, cp_size))
    for a in range(row.samples):
        for b in range(a + 1, row.samples):
            m = int(min(chunk[a], chunk[b]))
            sa, sb = int(start[a]), int(start[b])
            if m and not torch.equal(k[local[sa : sa + m]], k[local[sb : sb + m]]):
                perm = np.arange(local.numel())
                perm[sa : sa + m], perm[sb : sb + m] = perm[sb : sb + m], perm[sa : sa + m].copy()
                return {"kv_perm": {0: perm}}
    return None


# name -> the fault's ring_attention arguments for a row (None: it cannot be planted there)
CONTROLS: dict[str, Callable[[RingRow, int, object], dict | None]] = {
    "chunk_exchange": chunk_exchange,
    "wrong_zigzag": wrong_zigzag,
}


@dataclass
class _Control:
    rows: int = 0
    diffs: list[float] = field(default_factory=list)


@dataclass
class _Run:
    cp_size: int
    seed: int
    result: CheckResult
    budget: int | None = None  # for the ring's blocks and the samples run alone
    rows: int = 0
    samples: int = 0
    tokens: int = 0
    max_diff: float = 0.0
    controls: dict[str, _Control] = field(default_factory=lambda: {n: _Control() for n in CONTROLS})

    def row(self, row: RingRow) -> None:
        """The row through the ring vs each sample alone; then each control it can host."""
        import torch

        q, k, v = qkv_from_tokens(row.ids, self.seed, "cpu", torch.float32)
        alone = []
        for j, (a, b) in enumerate(alone_segments(row.positions)[: row.samples]):
            n = int(min(b - a, row.real[j])) if j < row.real.size else b - a
            alone.append(
                (
                    j,
                    a,
                    b,
                    reference_attention(q[a : a + n], k[a : a + n], v[a : a + n], self.budget),
                )
            )
        scores = block_scores(q.shape[1], budget_bytes(self.budget))
        out = ring_attention(q, k, v, row.cu_padded, self.cp_size, scores=scores)
        if row.item is not None:
            self.rows, self.tokens = self.rows + 1, self.tokens + len(row.ids)
            for (j, a, b, _), diff in zip(alone, _diffs(out, alone)):
                self.samples += 1
                self.max_diff = max(self.max_diff, diff)
                if diff > TOL:
                    self._fail(row.item, j, a, b, diff)
        for name, plant in CONTROLS.items():
            fault = plant(row, self.cp_size, k)
            if fault is None:
                continue
            faulty = ring_attention(q, k, v, row.cu_padded, self.cp_size, **fault, scores=scores)
            diff = max(_diffs(faulty, alone))
            self.controls[name].rows += 1
            self.controls[name].diffs.append(diff)
            if diff <= THRESHOLD:
                where = f"{row.item.shard} row {row.item.row}" if row.item else "a joined row"
                self.result.fail(
                    Failure(
                        f"{where}: the {name} control changes its samples by only {diff:.3g} "
                        f"(needs > {THRESHOLD:g}): the CP attention check could not see that "
                        "fault here, so it proves nothing",
                        shard=row.item.shard if row.item else None,
                        row=row.item.row if row.item else None,
                    )
                )

    def _fail(self, item: RowInput, j: int, a: int, b: int, diff: float) -> None:
        self.result.fail(
            sample_failure(
                item,
                sample_label(item.shard, item.row, item.data, a, b, j),
                f"ring attention over {self.cp_size} CP ranks (zigzag chunks) differs from "
                f"the sample run alone by {diff:.3g} (tolerance {TOL:g}): a rank's chunks "
                "see another sample's tokens or miss their own",
            )
        )


def _diffs(out, alone: list) -> list[float]:
    """Largest difference per sample: the ring's output over its real tokens vs alone."""
    return [
        float((out[a : a + len(ref)] - ref).abs().max()) if len(ref) else 0.0
        for _, a, _, ref in alone
    ]


def splits(shard: ShardArrays, r: int, cp_size: int) -> bool:
    cu = shard.cu[int(shard.cu_off[r]) : int(shard.cu_off[r + 1])].astype(np.int64)
    return cu.size >= 2 and not np.any(np.diff(cu) % (2 * cp_size))


def run_cp_attention(
    statuses: list[RowStatus],
    cp_size: int,
    count: int | None,
    seed: int,
    result: CheckResult,
    on_row: Callable[[int, int], None] | None = None,
    budget: int | None = None,
) -> None:
    """Simulate `cp_size` ranks over `count` rows that split for it (picked with `seed`, as the
    attention check picks), and the negative controls; fill `result`. `budget`: what the
    ring's partial attentions and the samples run alone may hold."""
    import torch

    t0 = time.perf_counter()
    candidates = []
    for s, st in enumerate(statuses):
        n_seg = np.diff(st.shard.cu_off) - 1
        for r in np.flatnonzero(st.cu_usable):
            if splits(st.shard, int(r), cp_size):
                candidates.append((s, int(r), int(n_seg[r])))
    rows = [ring_row(statuses[s].shard, r) for s, r in pick_rows(candidates, count, seed)]
    run = _Run(cp_size, seed, result, budget_bytes(budget))
    if on_row:
        on_row(0, len(rows))
    with torch.inference_mode():
        for done, row in enumerate(rows, 1):
            run.row(row)
            if on_row:
                on_row(done, len(rows))
        synthetic = bool(rows) and any(c.rows == 0 for c in run.controls.values())
        if synthetic:
            run.row(synthetic_row(cp_size))
    for name, control in run.controls.items():
        if rows and not control.rows:
            result.fail(Failure(f"the {name} control could not be planted in any row"))
    result.details.update(
        {
            "cp_size": cp_size,
            "rows": run.rows,
            "samples": run.samples,
            "tokens": run.tokens,
            "max_diff": run.max_diff,
            "tolerance": TOL,
            "threshold": THRESHOLD,
            "controls": {
                name: {
                    "rows": c.rows,
                    "min_diff": min(c.diffs) if c.diffs else None,
                    "caught": bool(c.diffs) and min(c.diffs) > THRESHOLD,
                }
                for name, c in run.controls.items()
            },
            "synthetic_control": synthetic,
            "seconds": round(time.perf_counter() - t0, 3),
        }
    )
    if not rows:
        result.ran = False
        result.skipped_reason = f"no row splits for cp_size {cp_size}"

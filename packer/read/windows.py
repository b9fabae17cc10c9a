"""The validated chunks of a stream, cut into windows of segments: each window one
`Samples`/`Segments` pair over the chunks' own token arrays (no copy), planned on its own as
`packer pack --window` plans them.
"""

from __future__ import annotations

import numpy as np

from packer.planning.overlength import Segments
from packer.read.samples import Samples, as_chunks


class Piece:
    """One validated chunk of a stream and how many of its segments are already packed."""

    def __init__(self, samples: Samples, segs: Segments):
        self.samples = samples
        self.segs = segs
        self.used = 0

    @property
    def left(self) -> int:
        return self.segs.num_segments - self.used


def window_samples(pieces: list[Piece], take: int) -> tuple[Samples, Segments]:
    """The next `take` segments of the pieces as one Samples/Segments pair (no token copy)."""
    parts = []
    chunks, label_chunks, starts = [], [], [0]
    need = take
    for p in pieces:
        if need == 0:
            break
        k = min(need, p.left)
        if k == 0:
            continue
        sl = slice(p.used, p.used + k)
        shift = starts[-1] - int(p.samples.chunk_starts[0])
        parts.append(
            (p.segs.sample[sl], p.segs.start[sl] + shift, p.segs.length[sl], p.segs.offset[sl])
        )
        chunks.extend(p.samples.token_chunks)
        if p.samples.label_chunks is not None:
            label_chunks.extend(p.samples.label_chunks)
        starts.extend((p.samples.chunk_starts[1:] + shift).tolist())
        p.used += k
        need -= k
    first = pieces[0].samples
    samples = Samples(
        tokens=None,
        offsets=np.zeros(1, np.int64),  # the window is read through its segments only
        labels=None,
        sources=first.sources,
        token_chunks=as_chunks(chunks),
        label_chunks=as_chunks(label_chunks) if first.label_chunks is not None else None,
        chunk_starts=np.asarray(starts, np.int64),
    )
    cat = [np.concatenate([p[i] for p in parts]) for i in range(4)]
    segs = Segments(*cat, dropped=0, truncated=0, split=0, tokens_removed=0)
    return samples, segs

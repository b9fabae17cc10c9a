"""What a mixture's manifests and summaries say of it: every source, before counting
(`describe_sources`) and after (`mixture_report` for the training output, `validation_report`
for the held-out one). One-plan, block and in-memory mixtures all report through it, so their
`mixture` sections are the same for the same choice.
"""

from __future__ import annotations

import numpy as np

from packer.config import PackConfig
from packer.pipelines.mixture.select import MixSource, MixturePlan
from packer.read.samples import Samples
from packer.storage import display


def file_counts(samples: Samples, files: list[list]) -> list[int]:
    """Samples in each source's files (rows read, rejected ones included)."""
    counts, k = [], 0
    for part in files:
        counts.append(sum(s.num_samples for s in samples.sources[k : k + len(part)]))
        k += len(part)
    return counts


def describe_sources(sources: list[MixSource], files: list[list], bounds: np.ndarray) -> list[dict]:
    """What the manifest says of every source before counting: what was named, the files,
    and the range of global sample indices (`sample_index`) its samples have."""
    return [
        {
            "path": s.raw or (s.paths[0] if len(s.paths) == 1 else list(s.paths)),
            **({"tokenized": s.paths[0]} if s.raw else {}),
            "files": [display(f) for f in part],
            "first_index": int(bounds[i]),
            "input_samples": int(bounds[i + 1] - bounds[i]),
            **({"columns": dict(s.columns)} if s.columns else {}),
        }
        for i, (s, part) in enumerate(zip(sources, files))
    ]


def mixture_report(
    planned: MixturePlan, described, cfg: PackConfig, split, mix_tokens: int | None
) -> dict:
    """The manifest's and the summary's `mixture`: seed, weights, size, and per source what
    it gave the training output."""
    total = sum(planned.tokens)
    sources = []
    m = planned.mixture
    for i, d in enumerate(described):
        mixed = m.sources[i].report() if m is not None else None
        weight = mixed["weight"] if mixed else 1.0
        sources.append(
            {
                **d,
                "weight": weight,
                "tokens": planned.tokens[i],
                "samples": planned.samples[i],
                "epochs": mixed["epochs"] if mixed else 1,
                "repeats": mixed["repeats"] if mixed else 0,
                "dropped": mixed["dropped"] if mixed else 0,
                "available": planned.available[i],
                "held_out": planned.held_out[i],
                "share": round(planned.tokens[i] / total, 6) if total else 0.0,
            }
        )
    return {
        "seed": cfg.seed,
        "weights": [s["weight"] for s in sources],
        "mix_tokens": mix_tokens,
        "validation_split": split,
        "sources": sources,
    }


def validation_report(planned: MixturePlan, described, cfg: PackConfig, split, train_out) -> dict:
    """The validation output's `mixture`: every held-out sample once, per source."""
    total = sum(planned.held_out_tokens)
    sources = [
        {
            **d,
            "weight": None,
            "tokens": planned.held_out_tokens[i],
            "samples": planned.held_out[i],
            "epochs": 1,
            "repeats": 0,
            "dropped": 0,
            "available": planned.held_out[i],
            "held_out": planned.held_out[i],
            "share": round(planned.held_out_tokens[i] / total, 6) if total else 0.0,
        }
        for i, d in enumerate(described)
    ]
    return {
        "seed": cfg.seed,
        "weights": None,
        "mix_tokens": None,
        "validation_split": split,
        "validation_of": display(train_out),
        "sources": sources,
    }

"""The mixture driver: `pack --mix` and `--validation-split`, a weighted mixture of sources whose
weights are met by tokens, and a held-out split, on every way packer packs.

Which module does what (the planning core itself is `packer.planning.mixture`):

- `select`: the sources (`MixSource`, from `--mix`, `datasets:` or `mix=`) and which samples a
  mixture packs, in what order: the validation split, the choice by tokens, the segments to plan.
- `read`: the sources' files read one by one, each with its own columns, joined into one
  `Samples` (in memory, or out of core past the memory budget).
- `report`: the manifests' and summaries' `mixture`: each source before counting and what it
  gave the training and the validation output.
- `one_plan`: `pack(..., mix=...)` with one global plan: read, choose, plan and write both
  outputs, the validation output committed first.
- `blocks`: a mixture on the block pipeline (`--block-size`, `--engine ray`): a length pass per
  block, the same choice as `one_plan`, then every block packs the samples chosen from it.
- `resume`: `--resume` of a block mixture killed after its validation output was committed.
- `dataset`: `pack_dataset(None, ..., mix=...)`, the same choice over data held in memory.
- `plan`: `packer plan --mix`, the choice and its plan from the lengths alone, writing nothing.

Nothing is imported here: each caller imports the module it needs.
"""

"""Every driver of a run: read -> plan -> write, on an engine (`packer.engines`).

- `pack` (`packer.pipelines.pack`): the library entry point behind `packer pack`; it checks its
  arguments and hands the run to one driver.
- `one_plan`: every input read, planned together and written (in memory, or out of core).
- `blocks`: the input cut into blocks, one `block_task` per block on an engine, the
  under-filled tail rows planned together and written by `block_tail` tasks at the end.
- `repack`: a packer output read back into its samples and packed again.
- `warmup`: `packer warmup`'s steps, and the kernels `pack` compiles while it reads.
- `result`: `PackResult` and `Stats`, the one statistics type every driver reports.
"""

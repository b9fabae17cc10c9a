"""Pack configuration: defaults, YAML presets and their validation.

Precedence: explicit command-line flags > the `--config` YAML file > these defaults.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import yaml

from packer import arguments as A
from packer.arguments import (
    DEFAULT_INPUT,
    DEFAULT_LABELS,
    ColumnName,
    column_option,
    named,
    parse_size,
)
from packer.contract.names import POLICIES
from packer.errors import UsageError, option
from packer.hashing import ALGORITHMS
from packer.planning.choices import ROW_ORDERS, STRATEGIES
from packer.planning.multiple import cp_multiple, multiple_text

ON_ERROR = ("error", "skip")
ENGINES = ("local", "ray")
TOKENIZER_ENGINES = ("auto", "hf", "fastokens")
# Where a run executes, or what tokenizes it, not what it produces: left out of the manifest,
# so that every engine writes the same bytes and a manifest's config reruns on any.
RUNTIME_FIELDS = ("engine", "ray_address", "tokenizer_engine")

PAIR_FIELDS = ("prompt_column", "chosen_column", "rejected_column")
COLUMN_FIELDS = ("input_column", "labels_column", *PAIR_FIELDS)

TARGET_SHARD_TOKENS = 1 << 24  # ~16M tokens: ~200 MB of int32 columns per shard


@dataclass
class PackConfig:
    max_len: int
    strategy: str = "bfd"
    overlength: str = "error"
    pad: bool = False
    pad_id: int = 0
    seed: int = 0
    window: int | None = None
    # "shuffle": rows written in a permutation seeded by `seed` (packer.planning.row_order);
    # "plan": in the planner's order (longest rows first for the decreasing strategies)
    row_order: str = "shuffle"
    input_column: str = DEFAULT_INPUT
    # read when the input has it; a labels column that was named must be there (packer.read.columns)
    labels_column: str | None = DEFAULT_LABELS
    shard_rows: int | None = None  # None: as many rows as hold ~16M tokens
    on_error: str = "error"  # bad samples: "error" stops at the first, "skip" leaves them out
    hash: str = "xxh3_128"  # content hash of each shard in the manifest (or "sha256")
    # Input bytes per block (see packer.read.blocks); None: one global plan. Part of the output's
    # identity: both engines cut the same blocks from the same value.
    block_size: int | None = None
    engine: str = "local"  # "local" or "ray"
    ray_address: str | None = None  # None: start a local Ray; "auto", host:port or ray://...
    # Preference pairs (packer.read.pairs): each input row is a prompt with a chosen and a
    # rejected completion, packed as two adjacent segments of one row. Recorded in the manifest
    # only when set, so that sample manifests are as before.
    pairs: bool = False
    prompt_column: str = ColumnName("prompt_input_ids")
    chosen_column: str = ColumnName("chosen_input_ids")
    rejected_column: str = ColumnName("rejected_input_ids")
    # Context parallelism (packer.planning.cp): every segment padded at its end to a multiple
    # of 2 x cp_size, rows carrying cu_seqlens_padded. 1 is off; recorded only when above 1.
    cp_size: int = 1
    # Sequence parallelism (Megatron-Bridge): tensor-parallel ranks split each CP rank's tokens
    # too, so segments pad to lcm(2 x cp_size, cp_size x tp_size), even at cp_size 1. Without
    # sequence_parallel, tp_size changes nothing. Recorded only when sequence_parallel is on.
    tp_size: int = 1
    sequence_parallel: bool = False
    # With --tokenizer: what turns raw texts into ids ("auto", "hf", "fastokens"); the same
    # bytes with any (packer.tokenize.engines), so a runtime field
    tokenizer_engine: str = "auto"

    @property
    def segment_multiple(self) -> int:
        """What every segment's padded length is a multiple of (1: no padded layout)."""
        return cp_multiple(self.cp_size, self.tp_size, self.sequence_parallel)

    def rows_per_shard(self) -> int:
        return self.shard_rows or max(1, TARGET_SHARD_TOKENS // self.max_len)

    def validate(self) -> PackConfig:
        """Check every field (one line naming the option) and normalise numpy ints to int, so
        that the manifest's JSON and numba see plain values."""
        self.max_len = A.integer(self.max_len, "max_len", minimum=1)
        if self.max_len > 2**30:
            raise UsageError(f"{option('max_len')} {self.max_len} is too large (at most 2^30)")
        A.choice(self.strategy, "strategy", STRATEGIES)
        A.choice(self.row_order, "row_order", ROW_ORDERS)
        A.choice(self.overlength, "overlength", POLICIES)
        A.choice(self.on_error, "on_error", ON_ERROR)
        A.choice(self.hash, "hash", ALGORITHMS)
        self.pad = A.boolean(self.pad, "pad")
        self.pad_id = A.integer(self.pad_id, "pad_id")
        if not 0 <= self.pad_id < 2**31:
            raise UsageError(
                f"{option('pad_id')} {self.pad_id} must be a token id from 0 to {2**31 - 1} "
                "(verify rejects a negative pad id)"
            )
        A.text(self.input_column, "input_column")
        if self.labels_column is not None and not isinstance(self.labels_column, str):
            raise UsageError(
                f"{option('labels_column')} must be a column name or none, "
                f"got {self.labels_column!r}"
            )
        if self.labels_column is not None and self.labels_column == self.input_column:
            raise UsageError(
                f"{option('labels_column')} '{self.labels_column}' is the "
                f"{option('input_column')} too: labels need a column of their own (or none)"
            )
        self.shard_rows = A.integer(self.shard_rows, "shard_rows", minimum=1, none=True)
        self.window = A.integer(self.window, "window", minimum=1, none=True)
        self.seed = A.integer(self.seed, "seed", minimum=0)
        A.choice(self.engine, "engine", ENGINES)
        A.choice(self.tokenizer_engine, "tokenizer_engine", TOKENIZER_ENGINES)
        if isinstance(self.block_size, str):
            self.block_size = parse_size(self.block_size, option("block_size"), minimum=1)
        self.block_size = A.integer(self.block_size, "block_size", minimum=1, none=True)
        A.text(self.ray_address, "ray_address", none=True)
        if self.ray_address is not None and self.engine != "ray":
            needs = option('engine="ray"', "--engine ray")
            raise UsageError(f"{option('ray_address')} needs {needs}")
        self.pairs = A.boolean(self.pairs, "pairs")
        self._validate_column_use()
        if self.pairs:
            self._validate_pairs()
        self.cp_size = A.integer(self.cp_size, "cp_size", minimum=1)
        self.tp_size = A.integer(self.tp_size, "tp_size", minimum=1)
        self.sequence_parallel = A.boolean(self.sequence_parallel, "sequence_parallel")
        if self.segment_multiple > 1:
            self._validate_cp()
        return self

    def _validate_column_use(self) -> None:
        """A column option the run would not read is refused, not ignored: pairs read only
        the pair columns, samples only the input and labels columns."""
        pairs = option("pairs=True", "--pairs")
        if not self.pairs:
            for name in PAIR_FIELDS:
                value = getattr(self, name)
                if named(value):
                    raise UsageError(
                        f"{column_option(name, value)} is read only with {pairs} (preference "
                        f"pairs); samples are read from {option('input_column')} and "
                        f"{option('labels_column')}"
                    )
            return
        for name in ("input_column", "labels_column"):
            value = getattr(self, name)
            if value and named(value):
                raise UsageError(
                    f"{column_option(name, value)} cannot be used with {pairs}: pairs are read "
                    f"from {option('prompt_column')}, {option('chosen_column')} and "
                    f"{option('rejected_column')}, and their labels are made from them (the "
                    "prompt -100, each completion its own tokens)"
                )

    def _validate_cp(self) -> None:
        """Every sample splits into `segment_multiple` equal chunks, so rows must too; CP runs
        on the local engine with one plan, on samples (not pairs)."""
        mult = self.segment_multiple
        what = multiple_text(self.cp_size, self.tp_size, self.sequence_parallel, option)
        name = option("cp_size") if self.cp_size > 1 else option("sequence_parallel")
        if self.max_len % mult:
            raise UsageError(
                f"{option('max_len')} {self.max_len} must be a multiple of {what} "
                f"(each row splits into {mult} equal chunks); "
                f"try {option('max_len')} {max(mult, self.max_len // mult * mult)}"
            )
        if self.pairs:
            raise UsageError(f"{name} cannot be used with {option('pairs')}")
        if self.block_size is not None or self.engine != "local":
            raise UsageError(
                f"{name} runs on the local engine with one global plan (no "
                f"{option('block_size')}, no {option('engine')} ray)"
            )

    def _validate_pairs(self) -> None:
        """A pair is never split, its columns are three distinct names, and it runs on the
        local engine with one plan (pair files are read whole)."""
        names = [self.prompt_column, self.chosen_column, self.rejected_column]
        for name, value in zip(PAIR_FIELDS, names):
            A.text(value, name)
        if len(set(names)) != 3:
            raise UsageError(
                f"{option('prompt_column')}, {option('chosen_column')} and "
                f"{option('rejected_column')} must be three different columns, got {names}"
            )
        if self.overlength == "split":
            raise UsageError(
                f"{option('overlength')} split cannot be used with {option('pairs')}: a pair "
                "is never split (choose drop or truncate)"
            )
        if self.max_len < 2:
            raise UsageError(f"{option('max_len')} must be at least 2 with {option('pairs')}")
        if self.block_size is not None or self.engine != "local":
            raise UsageError(
                f"{option('pairs')} runs on the local engine with one global plan (no "
                f"{option('block_size')}, no {option('engine')} ray)"
            )

    def to_dict(self) -> dict:
        """The configuration recorded in the manifest: what shapes the output, nothing else.

        The engine and its address are left out (they never change the bytes); `block_size` is
        recorded only when set, so one-global-plan manifests are as before.
        """
        values = asdict(self)
        for name in RUNTIME_FIELDS:
            del values[name]
        if values["block_size"] is None:
            del values["block_size"]
        if not values["pairs"]:
            for name in ("pairs", *PAIR_FIELDS):
                del values[name]
        if values["cp_size"] == 1:
            del values["cp_size"]
        if not values["sequence_parallel"]:  # tp_size alone changes nothing
            del values["tp_size"], values["sequence_parallel"]
        return values


FIELDS = {f.name: f for f in fields(PackConfig)}


def load_yaml(path: str | Path) -> dict:
    """Read a YAML preset into option values; unknown keys and wrong types are errors."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read config: {exc.strerror or exc}", where=str(path)) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}: line {mark.line + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"invalid YAML ({problem})", where=where) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError("a config file must be a mapping of option: value", where=str(path))
    manifest = isinstance(data.get("config"), dict) and (
        "packer_version" in data or "format_version" in data
    )
    data_inputs = data.get("inputs")
    data = {k: v for k, v in data.items() if k != "datasets"}  # the mixture: `load_datasets`
    if manifest:
        # a packer manifest (JSON is YAML): its config section packs again exactly as it was;
        # outputs of format 1 have no row_order and were written in the plan's order
        data = {"row_order": "plan", **data["config"]}
    values = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in FIELDS:
            known = ", ".join(sorted(FIELDS))
            raise UsageError(f"unknown option '{key}' (known: {known})", where=str(path))
        values[name] = _coerce(name, value, path)
        if name in COLUMN_FIELDS and isinstance(values[name], str):
            # errors name the config key and file
            values[name] = ColumnName(values[name], str(path))
    if manifest:
        _manifest_columns(values, data_inputs)
    return values


def load_datasets(path: str | Path | None) -> dict | None:
    """The mixture a YAML preset names, `datasets: [{path: ..., weight: ...}, ...]`, as
    {"mix": [{"path", "weight", and its own columns if any}, ...]}; a mixture's manifest.json gives its sources, weights,
    `mix_tokens` and `validation_split` too, so that it packs again as it was. None without
    one. A weight is a share of the output's tokens."""
    if path is None:
        return None
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))  # load_yaml checked it
    if not isinstance(data, dict):
        return None
    if "datasets" not in data:
        return _manifest_mixture(data)
    entries = data["datasets"]
    if not isinstance(entries, list) or not entries:
        raise UsageError("'datasets' must be a non-empty list of {path, weight}", where=str(path))
    pairs = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "path" not in entry:
            raise UsageError(f"datasets[{i}] must be a mapping with a path", where=str(path))
        extra = sorted(set(entry) - {"path", "weight", "input_column", "labels_column"})
        if extra:
            raise UsageError(
                f"datasets[{i}]: unknown key '{extra[0]}' (a dataset has a path, a weight, and "
                "may have its own input_column and labels_column)",
                where=str(path),
            )
        weight = entry.get("weight", 1)
        ok = isinstance(weight, (int, float)) and not isinstance(weight, bool)
        if not ok or not math.isfinite(weight) or weight <= 0:
            raise UsageError(
                f"datasets[{i}]: the weight must be a number above 0, got {weight!r}",
                where=str(path),
            )
        if not isinstance(entry["path"], str) or not entry["path"]:
            raise UsageError(f"datasets[{i}]: the path must be a string", where=str(path))
        columns = {
            k: ColumnName(v, f"{path} datasets[{i}]") if isinstance(v, str) else v
            for k, v in entry.items()
            if k in ("input_column", "labels_column")
        }
        pairs.append({"path": entry["path"], "weight": float(weight), **columns})
    return {"mix": pairs, "datasets": str(path)}


def _manifest_mixture(data: dict) -> dict | None:
    """A training output's manifest: its mixture as `pack` takes it (None for other files,
    for a validation output, and for a split of plain inputs, which need INPUT)."""
    mixture = data.get("mixture") if "packer_version" in data else None
    if not isinstance(mixture, dict) or mixture.get("validation_of") is not None:
        return None
    weights, sources = mixture.get("weights"), mixture.get("sources") or []
    if not isinstance(weights, list) or any(not isinstance(s.get("path"), str) for s in sources):
        return None
    return {
        "mix": [
            {"path": s["path"], "weight": float(w), **(s.get("columns") or {})}
            for s, w in zip(sources, weights)
        ],
        "mix_tokens": mixture.get("mix_tokens"),
        "validation_split": mixture.get("validation_split"),
    }


def _manifest_columns(values: dict, inputs) -> None:
    """A manifest records every column option, read or not: the ones its run did not read
    are defaults again, and its labels column is named only when its inputs had labels."""
    has_labels = isinstance(inputs, list) and any(
        isinstance(i, dict) and i.get("has_labels") for i in inputs
    )
    unread = ("input_column", "labels_column") if values.get("pairs") else PAIR_FIELDS
    for name in unread + (() if has_labels else ("labels_column",)):
        if isinstance(values.get(name), str):
            values[name] = ColumnName(values[name])


def _coerce(name: str, value, path: Path):
    kind = FIELDS[name].type
    if name == "block_size" and isinstance(value, str):  # a size such as 64MiB
        try:
            return parse_size(value, "block_size", minimum=1)
        except UsageError as exc:
            raise UsageError(exc.problem, where=str(path)) from None
    expected = {"int": int, "int | None": int, "bool": bool, "str": str, "str | None": str}[kind]
    if value is None and "None" in kind:
        return None
    ok = isinstance(value, expected) and not (expected is int and isinstance(value, bool))
    if not ok:
        raise UsageError(
            f"option '{name}' must be {expected.__name__}, got {value!r}", where=str(path)
        )
    return value


def build_config(config_file: str | Path | None, overrides: dict) -> PackConfig:
    """Merge defaults, a YAML preset and the flags that were given (None means not given)."""
    values = load_yaml(config_file) if config_file else {}
    values.update({k: v for k, v in overrides.items() if v is not None})
    if "max_len" not in values:
        raise UsageError("--max-len is required (on the command line or in --config)")
    return PackConfig(**values).validate()

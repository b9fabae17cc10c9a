"""What `packer tokenize` and `packer pack RAW --tokenizer` share: the tokenizer's options, the
encoder they describe, the tokenizing progress and summary, and pack's tokenize step."""

from __future__ import annotations

import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from packer.cli.chat_options import (
    TRAIN_ON,
    TURNS,
    given_mask_flag,
    mask_options,
    with_mask_options,
)
from packer.cli.raw_mix import named_once, one_source_per_entry, raw_mix
from packer.errors import InputError, UsageError, count

ENGINES = ("local", "ray")
ON_ERROR = ("error", "skip")
RAW_KEYS = (
    "messages",
    "conversations",
    "text",
    "prompt",
    "completion",
    "instruction",
    "input",
    "output",
)

TOKENIZER_ENGINES = ("auto", "hf", "fastokens")
TOKENIZER_ENGINE_HELP = (
    "What turns texts into ids: hf (Hugging Face tokenizers, the reference), fastokens (faster; "
    "only where it loads the tokenizer and is proven to give hf's ids on it, else an error) or "
    "auto (fastokens where installed and proven, else hf with one line saying why). The output "
    "is the same bytes with either (docs/engines.md). [default: auto]"
)
TOKENIZER_HELP = (
    "A local tokenizer directory (save_pretrained layout; works offline) or a hub name "
    "(needs the hub)."
)
COLUMN_HELP = (
    "A raw column under another name, KEY=NAME (e.g. messages=dialog); KEY is one of "
    + ", ".join(RAW_KEYS)
    + "; repeatable. [default: the KEY names]"
)


def make_encoder(
    tokenizer: str,
    chat_template,
    train_on: str | None,
    allow_empty_mask: bool,
    options: dict | None = None,
    tokenizer_engine: str | None = None,
):
    """The encoder the flags describe (errors name --tokenizer, --chat-template, --train-on,
    --turns, --tokenizer-engine); `options`: `mask_options`."""
    from packer import arguments as A
    from packer.tokenize.encode import Encoder

    train_on = A.choice(train_on or "assistant", "train_on", TRAIN_ON)
    given = {k: v for k, v in (options or {}).items() if v is not None}
    if "turns" in given:
        given["turns"] = A.choice(given["turns"], "turns", TURNS)
    return Encoder(
        tokenizer,
        chat_template=str(chat_template) if chat_template is not None else None,
        train_on=train_on,
        allow_empty_mask=allow_empty_mask,
        tokenizer_engine=tokenizer_engine or "auto",
        **given,
    )


def raw_columns(pairs: list[str]):
    """`RawColumns` with the --column KEY=NAME renames applied."""
    from dataclasses import fields, replace

    from packer.errors import UsageError
    from packer.tokenize.records import RawColumns

    columns = RawColumns()
    keys = {f.name for f in fields(columns)}
    renames = {}
    for pair in pairs:
        key, sep, name = pair.partition("=")
        if not sep or not name or key not in keys:
            raise UsageError(
                f"--column must be KEY=NAME with KEY one of {', '.join(sorted(keys))}, got {pair!r}"
            )
        renames[key] = name
    return replace(columns, **renames)


def summary(report: dict) -> str:
    if report["reused"]:
        return f"tokenized output reused from the cache: {report['output']}"
    rate = f", {report['tokens_per_second']:,} tokens/s" if report["tokens_per_second"] else ""
    rejected = f", {report['rejected']:,} rejected" if report["rejected"] else ""
    where = f"{report['workers']} workers"
    if report.get("engine", "local") != "local":
        where = f"on {report['engine']} tasks"
    if report.get("batches_reused"):
        rejected += (
            f", {count(report['batches_reused'], 'batch', 'batches')} kept from the killed run"
        )
    return (
        f"tokenized {report['lines']:,} lines into {report['samples']:,} samples, "
        f"{report['tokens']:,} tokens ({report['trained_tokens']:,} trained){rejected} in "
        f"{report['seconds']:.2f} s{rate}, {where}: {report['output']}"
    )


def say(text: str) -> None:
    from packer.cli.render import stderr

    stderr.print(text, highlight=False, markup=False, soft_wrap=True)


@contextmanager
def tokenize_progress(enabled: bool):
    """A `progress(stage, done, total, label)` for tokenizing: a spinner with lines and tokens
    per second on a terminal, a line every PACKER_PROGRESS_INTERVAL seconds elsewhere.

    The spinner is redrawn by `update` itself, never by rich's refresh thread: the worker pool
    forks only a process with no other thread (`packer.tokenize.run`), and with that thread
    running every worker was spawned instead, loading its own tokenizer (1 to 3.5 CPU s each)."""
    from packer.cli.render import ProgressLines, stderr

    if not enabled:
        yield None
        return
    if not stderr.is_terminal:
        yield ProgressLines(lambda stage, done, total, label: f"tokenizing: {label}")
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    bars = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=stderr,
        transient=True,
        auto_refresh=False,
    )
    task = bars.add_task("tokenizing")
    last = [0.0]

    def update(stage: str, done: int, total: int, label: str = "") -> None:
        now = time.monotonic()
        if now - last[0] >= 0.2:
            last[0] = now
            bars.update(task, description=f"tokenizing: {label}", refresh=True)

    with bars:
        yield update


@dataclass
class RawPack:
    """`pack RAW --tokenizer`: the tokenized cache entries pack reads instead of RAW, and the
    mixture options rewritten to name them. `session` holds the engine the batches were
    tokenized on (a Ray session) open until the pack is done: the pack runs on it, and Ray
    starts once (`raw_source` closes it)."""

    inputs: list[str]
    source: dict
    mixing: dict
    session: ExitStack = field(default_factory=ExitStack)


@dataclass(frozen=True)
class PackTokenizing:
    """The flags of `pack` that its tokenize step reads, by name (so that a flag renamed in
    `pack` fails where it is passed, not by being silently left out)."""

    tokenizer: str | None
    chat_template: Path | None
    train_on: str | None
    train_reasoning: bool | None
    train_tool_calls: bool | None
    turns: str | None
    tokenizer_engine: str | None  # --tokenizer-engine (None: the config's `tokenizer_engine`)
    template_date: str | None
    workers: int | None
    memory_budget: str | None
    resume: bool
    json_out: bool

    def mask_options(self) -> dict:
        """The chat-mask options given (None where not), by Encoder keyword."""
        return mask_options(vars(self))


def tokenize_for_pack(
    inputs,
    output,
    cfg,
    repack: bool,
    mixing: dict,
    flags: PackTokenizing,
) -> RawPack | None:
    """Tokenize pack's raw INPUT, or each raw source of --mix (`mixing`, the mixture options),
    through the cache (None without --tokenizer). The tokenizer engine (--tokenizer-engine,
    else the config's `tokenizer_engine`) is not part of the cache key: every engine gives the
    same bytes."""
    from packer.errors import UsageError

    if flags.resume and cfg.block_size is None and cfg.engine == "local":  # before tokenizing
        raise UsageError(
            "--resume picks up block runs: pass --block-size or --engine ray (not with --repack "
            "or --pairs)"
        )
    options = flags.mask_options()
    if flags.tokenizer is None:
        flag = given_mask_flag(options)
        flag = "--tokenizer-engine" if flags.tokenizer_engine is not None else flag
        if flags.chat_template is not None or flags.train_on is not None or flag:
            flag = "--chat-template" if flags.chat_template is not None else flag
            flag = "--train-on" if flags.train_on is not None else flag
            raise UsageError(f"{flag} needs --tokenizer (INPUT holds raw chats or text)")
        return None
    if repack or cfg.pairs:
        flag = "--repack" if repack else "--pairs"
        raise UsageError(f"--tokenizer cannot be used with {flag}: INPUT would hold token ids")
    from packer import arguments as A
    from packer.tokenize.cache import local_tokenizer_key

    train_on = A.choice(flags.train_on or "assistant", "train_on", TRAIN_ON)
    engine = flags.tokenizer_engine or cfg.tokenizer_engine
    flags = replace(flags, train_on=train_on, tokenizer_engine=engine)
    key = with_mask_options(
        local_tokenizer_key(flags.tokenizer, flags.chat_template, train_on), options
    )
    with ExitStack() as session:
        runner = session.enter_context(_runner(cfg, flags.workers))

        def tokenized(raw_inputs):
            return _tokenized(raw_inputs, output, cfg, flags, key, runner)

        raw = _tokenize_sources(inputs, dict(mixing or {}), tokenized)
        raw.session = session.pop_all()  # kept open for the pack
    return raw


def _tokenize_sources(inputs, mixing: dict, tokenized) -> RawPack:
    """Pack's raw INPUT, or each raw source of --mix, tokenized."""
    from packer.tokenize.cache import describe_source

    if "mix" not in mixing:
        from packer.pipelines.mixture.select import TokenizedEntry

        result = tokenized(inputs)
        named = [str(p) for p in inputs]
        entry = TokenizedEntry(str(result.output), named[0] if len(named) == 1 else named)
        return RawPack([entry], describe_source(result), mixing)
    results, pairs = [], []
    mix = raw_mix(mixing["mix"])
    named_once([path for path, _ in mix])
    for path, weight in mix:
        result = tokenized([path])
        one_source_per_entry(results, result, len(results))
        results.append(result)
        pairs.append({"path": result.output, "weight": weight, "raw": path})
    described = [describe_source(r) for r in results]
    source = {
        "encoder": described[0]["encoder"],
        "sources": [{k: v for k, v in d.items() if k != "encoder"} for d in described],
    }
    return RawPack([], source, {**mixing, "mix": pairs})


def _tokenized(inputs, output, cfg, flags: PackTokenizing, key: str, runner):
    """One raw source tokenized through the cache (on `runner`: None for this machine's worker
    processes), its summary said (not with --json)."""
    from packer.storage import is_url
    from packer.tokenize.cache import tokenized_input

    skip = output if is_url(output) else Path(output)
    warm = cfg.strategy if runner is None else None
    shown = not flags.json_out
    with tokenize_progress(shown) as bars, warming_meanwhile(warm, bars) as progress:
        result = tokenized_input(
            inputs,
            lambda: make_encoder(
                flags.tokenizer,
                flags.chat_template,
                flags.train_on,
                False,
                flags.mask_options(),
                flags.tokenizer_engine,
            ),
            encoder_key=key,
            workers=flags.workers,
            memory_budget=flags.memory_budget,
            on_error=cfg.on_error,
            progress=progress,
            skip=skip,
            resume=flags.resume,
            runner=runner,
        )
    if result.rebuilt:  # also with --json: the cache was not what it claimed
        say(f"note: tokenize cache entry {result.output} tokenized again: {result.rebuilt}")
    if shown:
        say(summary(result.report()))
        if result.rejected:
            say(
                f"note: {count(result.rejected, 'raw record')} left out, listed in "
                f"{Path(result.output) / 'rejects.txt'}"
            )
    return result


@contextmanager
def warming_meanwhile(strategy: str | None, progress):
    """`progress`, wrapped to start loading the packing step's kernels (numba and its cached
    code: half a CPU second) in a thread at the first batch done, so that they load while the
    workers tokenize rather than after. Only then: the pool forks a process with no other
    thread. The thread is joined on the way out, before any other pool forks."""
    if strategy is None:
        yield progress
        return
    started = []

    def report(stage: str, done: int, total: int, label: str = "") -> None:
        if not started:
            from packer.pipelines.warmup import start_warming

            started.append(start_warming(strategy))
        if progress is not None:
            progress(stage, done, total, label)

    try:
        yield report
    finally:
        for warming in started:
            warming.stop()


def _runner(cfg, workers: int | None):
    return engine_runner(cfg.engine, cfg.ray_address, workers)


def engine_runner(engine: str | None, ray_address: str | None, workers: int | None):
    """A context giving the tokenize runner of --engine: None (worker processes) for local;
    with ray, the batches are tokenized as Ray tasks. Checks the flags at once."""
    from packer import arguments as A

    engine = A.choice(engine or "local", "engine", ENGINES)
    if ray_address is not None and engine != "ray":
        raise UsageError("--ray-address needs --engine ray")
    return _engine_runner(engine, ray_address, workers)


@contextmanager
def _engine_runner(engine: str, ray_address: str | None, workers: int | None):
    if engine == "local":
        yield None
        return
    from packer.pipelines.tokenize_engine import EngineRunner
    from packer.workers import available

    runner = EngineRunner(engine, ray_address, workers or available())
    try:
        yield runner
    finally:
        runner.close()


@contextmanager
def raw_source(raw: RawPack | None):
    """While packing a tokenized cache entry, its manifest records where it came from."""
    if raw is None:
        yield
        return
    from packer.tokenize.source import packing_raw

    with raw.session, packing_raw(raw.source):
        yield


@contextmanager
def retokenized(output: str, inputs, tokenizer, chat_template, train_on, options=None):
    """`verify --input RAW --tokenizer`: the raw inputs tokenized afresh into a temporary
    directory (never the cache: the check is against a new render of the raw records, its
    spans found again by the same code), after checking that the output was packed with the
    same encoder, always with the `hf` engine. Yields the inputs to verify. `options`:
    `mask_options`."""
    if tokenizer is None:
        flag = given_mask_flag(options)
        if chat_template is not None or train_on is not None or flag:
            flag = "--chat-template" if chat_template is not None else flag
            flag = "--train-on" if train_on is not None else flag
            raise UsageError(f"{flag} needs --tokenizer (--input holds raw chats or text)")
        yield inputs
        return
    if not inputs:
        raise UsageError("--tokenizer needs --input: the raw records the output was packed from")
    import json
    import shutil
    import tempfile

    from packer.tokenize.run import tokenize

    # always the reference engine: an output made with fastokens is checked by hf
    encoder = make_encoder(tokenizer, chat_template, train_on, False, options, "hf")
    try:
        manifest = json.loads((Path(output) / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        manifest = {}  # verify reports what is wrong with the output
    packed = ((manifest.get("tokenized_from") or {}).get("encoder") or {}).get("fingerprint")
    if packed is not None and packed != encoder.fingerprint:
        raise InputError(
            "was packed with another tokenizer, template or --train-on (or --train-reasoning, "
            "--train-tool-calls, --turns, --template-date) than the flags give (tokenized_from.encoder in its "
            "manifest)",
            where=output,
        )
    tmp = Path(tempfile.mkdtemp(prefix="packer-verify-raw-"))
    try:
        result = tokenize(inputs, tmp / "tokenized", encoder, on_error=_on_error(manifest))
        yield [result.output]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _on_error(manifest: dict) -> str:
    return "skip" if (manifest.get("config") or {}).get("on_error") == "skip" else "error"

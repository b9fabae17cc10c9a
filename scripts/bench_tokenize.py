"""Raw chats to packed rows: `packer pack RAW --tokenizer` against the tokenizer alone.

Generates LINES raw records (chats with an optional system prompt and 1-4 turns, texts,
prompt/completion pairs), trains a small BPE tokenizer on them and gives it a ChatML template
without generation tags (nothing is downloaded), then times, on the same lines:

- baseline: one process that parses the lines, renders every chat with the template and
  batch-tokenizes all the rendered texts (`tokenizer(texts)`): the tokenizer's own cost, on one
  thread (one core's work: what "near-linear in cores" is measured against), and again with
  `encode_batch`'s own threads (`TOKENIZERS_PARALLELISM=true`), the fastest one process gets;
- raw -> packed: `packer pack RAW --tokenizer DIR -L L1` with a cold cache (a subprocess,
  start-up included), and the issue's guard (<= 1.0x the baseline) and goal (0.6x on 2 cores);
- again at L2: the same raw data packed at another L, from the cache (goal <= 0.5x the first).

- TRL: the dataset preparation `SFTTrainer` runs (`SFTTrainer._prepare_dataset`, called
  directly: it needs no model), `datasets.map` with caching off, `dataset_num_proc` = the
  workers, assistant-only loss. TRL derives masks only from `{% generation %}` tags, so it gets
  the same ChatML template with tags; its datasets are one per record kind (chats, texts,
  pairs), as TRL takes them.
- axolotl (`--axolotl PYTHON`, the python of a virtualenv that has axolotl: see
  scripts/axolotl_venv.sh): its preprocessing (`prepare_datasets`, what `axolotl preprocess`
  runs) in a subprocess of that python (scripts/axolotl_prepare.py), `dataset_num_proc` = the
  workers, caching off, `sample_packing: true`; chats as its `chat_template` type with the same
  ChatML template, texts as `completion`, pairs as a user-defined prompt format.

Each is run `--repeat` times in turn (baseline, packer, TRL, axolotl); the table gives the
medians and the median of each run's ratio to the baseline run beside it. `--memory N1 N2`
also packs N1 and N2 lines under `--memory-budget` and gives the peak memory of the packer
command and its workers together (sampled every 20 ms): resident (RSS) and anonymous (RssAnon:
what the processes hold themselves; RSS adds the pages of files they map, which an out-of-core
pack maps and the kernel can drop). Inputs above a million lines repeat the first million.

It also checks every chat's input_ids against the baseline's tokens of the same render (an
independent reference), and that `packer tokenize` + `packer pack` gives the same shard bytes.

    python scripts/bench_tokenize.py                # 20,000 lines, all cores
    python scripts/bench_tokenize.py --lines 4000 --workers 2 --memory 20000 80000
    python scripts/bench_tokenize.py --lines 5000 --no-trl --tokenizer-engine hf  # one engine
    python scripts/bench_tokenize.py --lines 2000 --workers 2 --no-trl \\
        --axolotl /work/venvs/axolotl/bin/python
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CHATML_TAGGED = (  # the same render, the replies and their <|im_end|> in generation tags
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] + '<|im_end|>' }}"
    "{% endgeneration %}{{ '\\n' }}{% else %}{{ m['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
VOCAB = [
    "the",
    "a",
    "of",
    "to",
    "and",
    "in",
    "is",
    "it",
    "that",
    "for",
    "on",
    "with",
    "as",
    "was",
    "by",
    "this",
    "be",
    "are",
    "from",
    "or",
    "an",
    "at",
    "which",
    "model",
    "data",
    "token",
    "packer",
    "row",
    "sample",
    "train",
    "chat",
    "reply",
    "question",
    "answer",
    "how",
    "why",
    "what",
    "when",
    "please",
    "explain",
    "short",
    "long",
    "first",
    "next",
    "last",
    "time",
    "value",
    "list",
    "file",
    "line",
]


def make_records(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)

    def sentence(lo: int, hi: int) -> str:
        return " ".join(rng.choice(VOCAB, int(rng.integers(lo, hi)))).capitalize() + "."

    out = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.6:
            messages = []
            if rng.random() < 0.5:
                messages.append({"role": "system", "content": sentence(5, 20)})
            for _ in range(int(rng.integers(1, 5))):
                messages.append({"role": "user", "content": sentence(5, 40)})
                messages.append({"role": "assistant", "content": sentence(10, 120)})
            out.append({"messages": messages})
        elif kind < 0.8:
            out.append({"text": " ".join(sentence(5, 30) for _ in range(int(rng.integers(1, 8))))})
        else:
            out.append({"prompt": sentence(5, 40), "completion": " " + sentence(5, 80)})
    return out


def make_tokenizer(path: Path, records: list[dict]) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    texts = [json.dumps(r) for r in records[:2000]]
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=special[1:],
    )
    fast.chat_template = CHATML
    fast.save_pretrained(str(path))


def baseline(
    raw: Path, tokenizer: Path, threads: bool
) -> tuple[tuple[float, float], dict[int, list[int]]]:
    """One process: parse, render every chat, batch-tokenize every text. (seconds, chat ids by
    line index). `threads`: let the tokenizer's encode_batch run its own threads (it reads
    TOKENIZERS_PARALLELISM at each call); without them the baseline is one core's work, the
    measure "near-linear in cores" is against."""
    from transformers import AutoTokenizer

    os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads else "false"
    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    t0, c0 = time.perf_counter(), time.process_time()
    texts, chats = [], {}  # chats: line index -> position of its render in texts
    with open(raw, encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            row = json.loads(line)
            if "messages" in row:
                chats[i] = len(texts)
                texts.append(tok.apply_chat_template(row["messages"], tokenize=False))
            elif "text" in row:
                texts.append(row["text"])
            else:
                texts += [row["prompt"], row["completion"]]
    encoded = tok(texts, add_special_tokens=False)["input_ids"]
    seconds = (time.perf_counter() - t0, time.process_time() - c0)
    os.environ.pop("TOKENIZERS_PARALLELISM")
    return seconds, {i: encoded[k] for i, k in chats.items()}


def trl_prepare(raw: Path, tokenizer: Path, workers: int, tmp: Path) -> tuple[float, float]:
    """TRL's SFT dataset preparation of the same lines: (wall seconds, CPU seconds of this
    process and its map workers). The tokenizer is loaded before the clock starts."""
    from types import SimpleNamespace

    from datasets import Dataset, disable_caching, disable_progress_bars
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    disable_caching()
    disable_progress_bars()
    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    tok.chat_template = CHATML_TAGGED
    args = SFTConfig(
        output_dir=str(tmp / "trl"),
        assistant_only_loss=True,
        dataset_num_proc=workers if workers > 1 else None,
        max_length=None,
        report_to=[],
        use_cpu=True,
        bf16=False,
    )
    trainer = SimpleNamespace(_tokenizer=tok, chat_template=None, completion_only_loss=True)
    t0, c0 = time.perf_counter(), time.process_time() + _children_cpu()
    kinds: dict[str, list[dict]] = {"messages": [], "text": [], "prompt": []}
    with open(raw, encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            kinds[next(k for k in kinds if k in row)].append(row)
    for name, rows in kinds.items():
        if rows:
            data = Dataset.from_list(rows)
            SFTTrainer._prepare_dataset(trainer, data, tok, args, False, None, name)
    return time.perf_counter() - t0, time.process_time() + _children_cpu() - c0


def axolotl_prepare(
    python: str, raw: Path, tokenizer: Path, workers: int, work: Path
) -> tuple[tuple[float, float], list[list[int]]]:
    """axolotl's preprocessing of the same lines in its own virtualenv: ((wall seconds, CPU
    seconds of its process and map workers, tokenizer loaded), each chat's input_ids)."""
    cmd = [python, str(ROOT / "scripts" / "axolotl_prepare.py"), str(raw), str(tokenizer)]
    cmd += [str(work), "--workers", str(workers), "--sample-packing"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode != 0:
        sys.exit(f"axolotl's preprocessing failed:\n{res.stderr[-4000:]}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    return (out["wall"], out["cpu"]), out["chat_ids"]


def worker_start(tokenizer: Path, tmp: Path, repeat: int) -> dict[str, float]:
    """Median CPU seconds for a spawned worker to start (interpreter, imports, its encoder from
    the spec): with the bench's tokenizer directory, and with a copy that has a model
    `config.json` (loaded through AutoTokenizer). A forked worker (Linux) has none of this."""
    import shutil

    sys.path.insert(0, str(ROOT))
    from packer.tokenize.encode import Encoder

    model = tmp / "tok-model"
    shutil.copytree(tokenizer, model)
    (model / "config.json").write_text("{}")
    code = (
        "import json, sys\nfrom packer.tokenize.worker import setup\n"
        "setup(json.loads(sys.stdin.read()), None, 'error')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    out = {}
    for name, path in (("tokenizer.json directory", tokenizer), ("model directory", model)):
        spec = json.dumps(Encoder(path).spec)
        cpu = []
        for _ in range(repeat):
            c0 = _children_cpu()
            subprocess.run([sys.executable, "-c", code], input=spec, text=True, env=env, check=True)
            cpu.append(_children_cpu() - c0)
        out[name] = median(cpu)
    return out


def peak_rss(cmd: list, env: dict) -> tuple[float, float, float]:
    """(wall seconds, peak RSS, peak RssAnon), in bytes, of the command and its children
    together."""
    import psutil

    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    top, peak, peak_anon = psutil.Process(proc.pid), 0, 0
    while proc.poll() is None:
        try:
            procs = [top, *top.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in procs))
            peak_anon = max(peak_anon, sum(_rss_anon(p.pid) for p in procs))
        except psutil.Error:
            pass
        time.sleep(0.02)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed:\n{proc.stderr.read().decode()}")
    return time.perf_counter() - t0, peak, peak_anon


def _rss_anon(pid: int) -> int:
    """RssAnon of a process in bytes (Linux; 0 where /proc does not say)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def memory_rows(sizes: list[int], workers: list, budget: str, seed: int, tmp: Path) -> list:
    """Peak RSS of raw -> packed at each size (a fresh cache each), one tokenizer for all."""
    rows, chunks = [], {}
    make_tokenizer(tmp / "mem-tok", make_records(min(max(sizes), 20_000), seed))
    for n in sizes:
        raw = tmp / f"mem-{n}.jsonl"
        with raw.open("w") as f:  # written in chunks: millions of records do not fit as objects
            for start in range(0, n, 100_000):
                first = start % 1_000_000  # past a million lines, the first million again
                key = (first, min(100_000, n - start))
                if key not in chunks:
                    records = make_records(key[1], seed + first)
                    chunks[key] = "".join(json.dumps(r) + "\n" for r in records)
                f.write(chunks[key])
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PACKER_CACHE_DIR": str(tmp / f"mc-{n}")}
        cmd = [sys.executable, "-m", "packer", "pack", raw, "--tokenizer", tmp / "mem-tok"]
        cmd += ["-o", tmp / f"mem-out-{n}", "-L", 4096, "--overlength", "split"]
        cmd += ["--memory-budget", budget, *workers]
        rows.append((n, *peak_rss(list(map(str, cmd)), env)))
        print(
            f"memory: {n:,} lines: {rows[-1][1]:.1f} s, peak RSS {rows[-1][2] / 2**20:,.0f} MiB, "
            f"RssAnon {rows[-1][3] / 2**20:,.0f} MiB",
            file=sys.stderr,
            flush=True,
        )
        raw.unlink()
    return rows


def packer(*args, env: dict) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the command and its workers)."""
    t0, c0 = time.perf_counter(), _children_cpu()
    res = subprocess.run(
        [sys.executable, "-m", "packer", *map(str, args)], capture_output=True, text=True, env=env
    )
    seconds = (time.perf_counter() - t0, _children_cpu() - c0)
    if res.returncode != 0:
        sys.exit(f"packer {' '.join(map(str, args))} failed:\n{res.stderr}")
    return seconds


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def digests(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.glob("shard-*"))
    }


def check_reference(tokenized: Path, by_line: dict[int, list[int]]) -> tuple[int, int]:
    """(chats whose input_ids equal the baseline's tokens of their render, chats)."""
    import pyarrow.parquet as pq

    ids = pq.read_table(sorted(tokenized.glob("part-*.parquet"))).column("input_ids").to_pylist()
    same = sum(ids[i] == ref for i, ref in by_line.items())
    return same, len(by_line)


def median(values) -> float:
    return float(np.median(values))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=20_000)
    ap.add_argument("--workers", type=int, default=None, help="default: all available cores")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-L", type=int, nargs=2, default=(4096, 8192), metavar=("L1", "L2"))
    ap.add_argument("--repeat", type=int, default=3, help="runs of each, medians reported")
    ap.add_argument("--no-trl", action="store_true", help="leave TRL's preparation out")
    ap.add_argument(
        "--axolotl", metavar="PYTHON", help="python of a virtualenv with axolotl: adds its row"
    )
    ap.add_argument("--memory", type=int, nargs=2, default=None, metavar=("N1", "N2"))
    ap.add_argument("--memory-budget", default="1GiB")
    ap.add_argument(
        "--tokenizer-engine",
        choices=["auto", "hf", "fastokens"],
        nargs="+",
        default=["hf", "fastokens"],
        help="packer's --tokenizer-engine, each in turn (the baseline and the peers use hf)",
    )
    args = ap.parse_args()
    if args.axolotl and not os.access(args.axolotl, os.X_OK):
        ap.error(
            f"--axolotl: {args.axolotl} is not an executable (scripts/axolotl_venv.sh builds one)"
        )
    cores = args.workers or len(os.sched_getaffinity(0))
    engines = list(dict.fromkeys(args.tokenizer_engine))
    runs: dict[str, list] = {"base": [], "threads": []}
    for name in engines:
        runs[f"first {name}"], runs[f"second {name}"] = [], []
    runs["trl"], runs["axolotl"] = [], []
    with tempfile.TemporaryDirectory(prefix="bench-tokenize-") as tmp:
        tmp = Path(tmp)
        records = make_records(args.lines, args.seed)
        raw = tmp / "raw.jsonl"
        raw.write_text("".join(json.dumps(r) + "\n" for r in records))
        make_tokenizer(tmp / "tok", records)
        workers = ["--workers", args.workers] if args.workers else []
        common = ("--tokenizer", tmp / "tok", "--overlength", "split", *workers)
        for k in range(args.repeat):
            base, by_line = baseline(raw, tmp / "tok", threads=False)
            runs["base"].append(base)
            runs["threads"].append(baseline(raw, tmp / "tok", threads=True)[0])
            for name in engines:  # a cold cache of its own each
                cache = tmp / f"c{k}-{name}"
                env = {**os.environ, "PYTHONPATH": str(ROOT), "PACKER_CACHE_DIR": str(cache)}
                engine = ("--tokenizer-engine", name)
                out = [tmp / f"p1-{k}-{name}", tmp / f"p2-{k}-{name}"]
                runs[f"first {name}"].append(
                    packer("pack", raw, "-o", out[0], "-L", args.L[0], *common, *engine, env=env)
                )
                runs[f"second {name}"].append(
                    packer("pack", raw, "-o", out[1], "-L", args.L[1], *common, *engine, env=env)
                )
            if not args.no_trl:
                runs["trl"].append(trl_prepare(raw, tmp / "tok", cores, tmp))
            if args.axolotl:
                seconds, axolotl_ids = axolotl_prepare(
                    args.axolotl, raw, tmp / "tok", cores, tmp / f"axolotl-{k}"
                )
                runs["axolotl"].append(seconds)
        packer(
            "tokenize",
            raw,
            "--tokenizer",
            tmp / "tok",
            "-o",
            tmp / "tok-out",
            *workers,
            "--tokenizer-engine",
            engines[0],
            env=env,
        )
        packer(
            "pack",
            tmp / "tok-out",
            "-o",
            tmp / "p3",
            "-L",
            args.L[0],
            "--overlength",
            "split",
            env=env,
        )
        same_bytes = digests(tmp / f"p1-0-{engines[0]}") == digests(tmp / "p3")
        engines_same = all(
            digests(tmp / f"p1-0-{name}") == digests(tmp / f"p1-0-{engines[0]}") for name in engines
        )
        matched, chats = check_reference(tmp / "tok-out", by_line)
        start = worker_start(tmp / "tok", tmp, args.repeat)
        memory = []
        if args.memory:
            memory = memory_rows(args.memory, workers, args.memory_budget, args.seed, tmp)
    load = os.getloadavg()[0]
    print(
        f"{args.lines:,} lines ({chats:,} chats), {cores} workers, ChatML without generation tags, "
        f"packer with --tokenizer-engine {', '.join(engines)}"
    )
    print(f"load average {load:.1f} on {os.cpu_count()} cores; medians of {args.repeat} runs")
    print("| run | wall s | vs baseline | vs threaded baseline | CPU s | vs baseline |")
    print("|---|---:|---:|---:|---:|---:|")
    names = {
        "base": "baseline: 1 process renders + batch-tokenizes, one thread (tokenizer loaded)",
        "threads": "the same with encode_batch's own threads",
    }
    for name in engines:
        names[f"first {name}"] = (
            f"packer pack RAW --tokenizer -L {args.L[0]} --tokenizer-engine {name} "
            "(cold cache, start-up included)"
        )
        names[f"second {name}"] = (
            f"packer pack RAW --tokenizer -L {args.L[1]} --tokenizer-engine {name} (from the cache)"
        )
    names["trl"] = f"TRL SFT preparation, datasets.map, {cores} procs (tokenizer loaded)"
    names["axolotl"] = f"axolotl preprocessing, sample_packing, {cores} procs (tokenizer loaded)"
    ratio, cpu_ratio, threaded_ratio = {}, {}, {}
    for key, name in names.items():
        if not runs[key]:
            continue
        wall = [w / b[0] for (w, _), b in zip(runs[key], runs["base"])]
        cpu = [c / b[1] for (_, c), b in zip(runs[key], runs["base"])]
        threaded = [w / b[0] for (w, _), b in zip(runs[key], runs["threads"])]
        ratio[key], cpu_ratio[key] = median(wall), median(cpu)
        threaded_ratio[key] = median(threaded)
        print(
            f"| {name} | {median([w for w, _ in runs[key]]):.2f} | {median(wall):.2f}x "
            f"| {median(threaded):.2f}x | {median([c for _, c in runs[key]]):.2f} "
            f"| {median(cpu):.2f}x |"
        )
    for name in engines:
        first, second = ratio[f"first {name}"], ratio[f"second {name}"]
        threads = threaded_ratio[f"first {name}"]
        # fastokens: <= 0.35x at 100,000 lines; below, the fixed part weighs: <= 0.6x at 20,000
        goal = (0.35 if args.lines >= 100_000 else 0.6) if name == "fastokens" else 1.0
        print(
            f"--tokenizer-engine {name}: {first:.3f}x one thread, {threads:.3f}x threaded "
            f"(goal <= {goal}x: {'met' if first <= goal else 'MISSED'}); "
            f"from the cache {second / first:.2f}x the first"
        )
        spread = sorted(w / b[0] for (w, _), b in zip(runs[f"first {name}"], runs["base"]))
        cpu = sorted(c for _, c in runs[f"first {name}"])
        print(
            f"  cold runs, each beside its baseline run: {spread[0]:.3f}x to {spread[-1]:.3f}x "
            f"one thread; their CPU seconds {cpu[0]:.2f} to {cpu[-1]:.2f}"
        )
        if "trl" in ratio:
            speedup, cpu_speedup = (
                ratio["trl"] / first,
                cpu_ratio["trl"] / cpu_ratio[f"first {name}"],
            )
            print(f"  vs TRL: {speedup:.1f}x faster, {cpu_speedup:.1f}x less CPU (goal >= 5x)")
        if "axolotl" in ratio:
            speedup = ratio["axolotl"] / first
            cpu_speedup = cpu_ratio["axolotl"] / cpu_ratio[f"first {name}"]
            print(f"  vs axolotl: {speedup:.1f}x faster, {cpu_speedup:.1f}x less CPU (goal >= 4x)")
    if "axolotl" in ratio:
        same = sum(a == b for a, b in zip(axolotl_ids, (by_line[i] for i in sorted(by_line))))
        print(f"{same:,}/{chats:,} of axolotl's chats' input_ids equal the baseline's")
    print(
        f"reference: {matched:,}/{chats:,} chats' input_ids equal the baseline's; "
        f"two-step shards {'byte-identical' if same_bytes else 'DIFFER'}; packed bytes "
        f"{'identical' if engines_same else 'DIFFER'} between {', '.join(engines)}"
    )
    print(
        "a spawned worker's start (imports, encoder): "
        + ", ".join(f"{k} {v:.2f} CPU s" for k, v in start.items())
        + "; forked workers (Linux) start with the driver's encoder"
    )
    if memory:
        print(f"\npeak RSS of raw -> packed, --memory-budget {args.memory_budget}, cold cache")
        print("| lines | wall s | peak RSS | peak RssAnon (command + workers) |")
        print("|---:|---:|---:|---:|")
        for n, wall, rss, anon in memory:
            print(f"| {n:,} | {wall:.1f} | {rss / 2**20:,.0f} MiB | {anon / 2**20:,.0f} MiB |")


if __name__ == "__main__":
    main()

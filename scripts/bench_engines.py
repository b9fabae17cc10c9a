"""Tokenizer engines side by side: HF `tokenizers`' `encode_batch` against fastokens on the
same texts, and what proving fastokens equal costs.

The texts are scripts/bench_tokenize.py's records (chats with an optional system prompt and
1-4 turns, texts, prompt/completion pairs): each chat rendered in the vocabulary's own chat
format (ChatML for the trained BPE, Llama 3's headers, `<META_START>`/`<EOT>` for the
anthropic vocabulary), each text and pair as it is. Vocabularies (nothing is downloaded):

- `bench`: the 2,000-token BPE bench_tokenize.py trains on the records;
- `anthropic`: the anthropic 0.38.0 wheel's 65,000-token BPE (.whl/), without its NFKC
  normalizer (fastokens has none; as shipped, `auto` falls back to hf);
- `llama3`: Meta's Llama 3 `tokenizer.model` (the llama-models 0.3.0 wheel in .whl/), 128,256
  tokens, converted with transformers' TikTokenConverter (tiktoken's file format read here).

For each: the median of `--runs` runs of encoding all texts (without special tokens, as chat
renders are) with hf `encode_batch`, fastokens `encode_batch` (a list of ids per text) and
fastokens `encode_batch_flat` (one buffer), tokens per second and the ratio to hf; every
engine's ids are checked equal to hf's. Then the proof: building the fastokens tokenizer, the
probe set's comparison (cache off), the cached proof's read, and `token_boundaries_batch`
for both ends of every chat's assistant turns (the span finder's use). `--threads` sets
RAYON_NUM_THREADS for both libraries (1: one core, as a packer worker runs).

    PYTHONPATH=. python scripts/bench_engines.py --lines 2000 --runs 3
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / ".whl"
LLAMA_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
    "<|image|>",
]
FORMATS = {  # (turn start, between role and content, turn end)
    "bench": ("<|im_start|>", "\n", "<|im_end|>\n"),
    "anthropic": ("<META_START>", "\n", "<EOT>\n"),
    "llama3": ("<|start_header_id|>", "<|end_header_id|>\n\n", "<|eot_id|>"),
}


def bench_backend(records, work: Path):
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_tokenize import make_tokenizer
    from tokenizers import Tokenizer

    make_tokenizer(work / "bench", records)
    return Tokenizer.from_file(str(work / "bench" / "tokenizer.json"))


def anthropic_backend():
    from tokenizers import Tokenizer

    with zipfile.ZipFile(WHEELS / "anthropic-0.38.0-py3-none-any.whl") as wheel:
        data = json.loads(wheel.read("anthropic/tokenizer.json"))
    data["normalizer"] = None
    return Tokenizer.from_str(json.dumps(data))


def llama3_backend():
    from tokenizers import processors
    from transformers.convert_slow_tokenizer import TikTokenConverter

    with zipfile.ZipFile(WHEELS / "llama_models-0.3.0-py3-none-any.whl") as wheel:
        model = wheel.read("llama_models/llama3/tokenizer.model")
    ranks = {}
    for line in model.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    TikTokenConverter.load_tiktoken_bpe = staticmethod(lambda _: ranks)
    specials = LLAMA_SPECIALS + [
        f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(LLAMA_SPECIALS))
    ]
    tok = TikTokenConverter("-", pattern=LLAMA_PATTERN, extra_special_tokens=specials).converted()
    bos = "<|begin_of_text|>"
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))]
            ),
        ]
    )
    return tok


def texts_of(records, name: str):
    """(texts, each chat's (render index, assistant turns' (start, end) characters))."""
    start, middle, end = FORMATS[name]
    texts, chats = [], []
    for r in records:
        if "messages" in r:
            parts, turns, at = [], [], 0
            for m in r["messages"]:
                head = start + m["role"] + middle
                piece = head + m["content"] + end
                if m["role"] == "assistant":
                    turns.append((at + len(head), at + len(piece)))
                parts.append(piece)
                at += len(piece)
            chats.append((len(texts), turns))
            texts.append("".join(parts))
        elif "text" in r:
            texts.append(r["text"])
        else:
            texts += [r["prompt"], r["prompt"] + r["completion"]]
    return texts, chats


def median_seconds(fn, runs: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(runs):
        started = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), out


def measure(name: str, backend, records, runs: int) -> dict:
    from packer.tokenize.boundaries import token_boundaries_batch
    from packer.tokenize.engines import FastokensEngine, HFEngine, resolve_engine
    from packer.tokenize.proof import prove_equal

    texts, chats = texts_of(records, name)
    hf = HFEngine(backend)
    started = time.perf_counter()
    fast = FastokensEngine.from_backend(backend)
    build = time.perf_counter() - started
    hf_s, want = median_seconds(lambda: hf.encode_batch(texts, add_special_tokens=False), runs)
    fk_s, got = median_seconds(lambda: fast.encode_batch(texts, add_special_tokens=False), runs)
    flat_s, (values, offsets) = median_seconds(
        lambda: fast.encode_flat(texts, add_special_tokens=False), runs
    )
    assert got == want, f"{name}: fastokens' ids differ from hf's"
    assert [values[a:b].tolist() for a, b in zip(offsets, offsets[1:])] == want
    tokens = sum(map(len, want))
    proof_s, proof = median_seconds(lambda: prove_equal(hf, fast, backend, cache=False), runs)
    assert proof.equal, proof.difference
    assert resolve_engine("auto", backend).name == "fastokens"  # writes the cache entry
    text = backend.to_str()  # resolve_engine has it already: it built fastokens from it
    cached_s, cached = median_seconds(
        lambda: prove_equal(hf, fast, backend, backend_json=text), runs
    )
    assert cached.cached and cached.equal
    renders = [texts[i] for i, _ in chats]
    chars = [[c for turn in turns for c in turn] for _, turns in chats]
    specials = [t.content for t in backend.get_added_tokens_decoder().values() if t.special]
    bounds = {}
    for engine in (hf, fast):
        ids = engine.encode_batch(renders, add_special_tokens=False)
        bounds[engine.name], found = median_seconds(
            lambda e=engine, i=ids: token_boundaries_batch(e, renders, i, chars, specials), runs
        )
        assert all(k is not None for ks in found for k in ks), f"{name}: a turn straddles"
    return {
        "name": name,
        "vocab": backend.get_vocab_size(),
        "texts": len(texts),
        "tokens": tokens,
        "hf": hf_s,
        "fastokens": fk_s,
        "flat": flat_s,
        "build": build,
        "probes": proof.probes,
        "proof": proof_s,
        "cached": cached_s,
        "bounds_hf": bounds["hf"],
        "bounds_fk": bounds["fastokens"],
        "chats": len(renders),
    }


def table(rows: list[dict], runs: int, threads: str) -> str:
    lines = [
        f"encode: medians of {runs} runs, RAYON_NUM_THREADS={threads}; ids equal on every text",
        "",
        "| vocabulary | texts | tokens | hf encode_batch | fastokens encode_batch | fastokens flat "
        "| hf tok/s | fastokens tok/s | flat tok/s | hf / fastokens | hf / flat |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} ({r['vocab']:,}) | {r['texts']:,} | {r['tokens']:,} | {r['hf']:.3f} s "
            f"| {r['fastokens']:.3f} s | {r['flat']:.4f} s | {r['tokens'] / r['hf']:,.0f} "
            f"| {r['tokens'] / r['fastokens']:,.0f} | {r['tokens'] / r['flat']:,.0f} "
            f"| {r['hf'] / r['fastokens']:.1f}x | {r['hf'] / r['flat']:.1f}x |"
        )
    lines += [
        "",
        "| vocabulary | fastokens build | probes | proof (uncached) | proof (cached) "
        "| boundaries, hf | boundaries, fastokens | chats |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['build'] * 1000:,.0f} ms | {r['probes']:,} "
            f"| {r['proof'] * 1000:,.0f} ms | {r['cached'] * 1000:,.0f} ms "
            f"| {r['bounds_hf'] * 1000:,.0f} ms | {r['bounds_fk'] * 1000:,.0f} ms | {r['chats']:,} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", default="1", help="RAYON_NUM_THREADS for both libraries")
    parser.add_argument(
        "--vocabularies", nargs="+", default=["bench", "anthropic", "llama3"], choices=list(FORMATS)
    )
    args = parser.parse_args()
    os.environ["RAYON_NUM_THREADS"] = args.threads  # read when either library starts its pool
    os.environ["TOKENIZERS_PARALLELISM"] = "false" if args.threads == "1" else "true"
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_tokenize import make_records

    records = make_records(args.lines, seed=0)
    rows = []
    with tempfile.TemporaryDirectory(prefix="packer-bench-engines-") as tmp:
        os.environ["PACKER_CACHE_DIR"] = str(Path(tmp) / "cache")
        for name in args.vocabularies:
            if name == "bench":
                backend = bench_backend(records, Path(tmp))
            elif name == "anthropic":
                backend = anthropic_backend()
            else:
                backend = llama3_backend()
            rows.append(measure(name, backend, records, args.runs))
            print(f"{name}: done", file=sys.stderr)
    print(table(rows, args.runs, args.threads))


if __name__ == "__main__":
    main()

"""What packer's trust checks on the tokenize path cost, next to the work they guard.

(a) A tokenize cache entry is used only when every shard its `tokenized.json` lists has its
    recorded xxh3 (`packer.tokenize.output.unsound`). Timed on an entry of ~100 MB of shards
    (random token lists, 1,024 rows a shard, as tokenize writes them) and on a 1,500-line entry
    of chats, against reading `tokenized.json` alone (what a lookup did before the check).
    The files are in the page cache (read once before timing), as on a second pack.
(b) A resumed tokenize batch is kept only when the input bytes it covers still hash as its
    record says (`packer.tokenize.files.batch_digest`): the cost per batch of JSONL lines,
    against tokenizing the same batch with a word-level tokenizer (a cheap tokenizer: a real
    one's BPE makes the ratio smaller still).

(c) `verify s3://...` reads every object its manifest lists from the store again
    (`local_copy(check_store=True)`), where it trusted a warm local copy before: the cost of
    that warm copy lookup against the store read, next to verifying the local copy itself
    (`--no-attention`), on an output of ~40 MB packed to a local moto S3 server (127.0.0.1;
    needs moto and boto3, skipped without them).

    python scripts/bench_trust_checks.py          # 7 runs each, medians
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def _median(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _random_entry(directory: Path, megabytes: int) -> Path:
    from packer import hashing
    from packer.tokenize.output import FORMAT, TOKENIZED, shard_name

    rng = np.random.default_rng(0)
    directory.mkdir()
    shards, written, b = [], 0, 0
    while written < megabytes << 20:
        lengths = rng.integers(200, 2000, 1024)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        values = rng.integers(0, 150_000, int(offsets[-1]), dtype=np.int32)
        ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        name = shard_name(0, b)
        pq.write_table(pa.table({"input_ids": ids, "labels": ids}), directory / name)
        written += (directory / name).stat().st_size
        shards.append({"file": name, hashing.DEFAULT: hashing.file_digest(directory / name)})
        b += 1
    manifest = {"format": FORMAT, "shards": shards}
    (directory / TOKENIZED).write_text(json.dumps(manifest))
    return directory


def _chat_entry(directory: Path) -> Path:
    """The issue's case: `pack RAW --tokenizer` on 1,500 lines; its cache entry."""
    import os

    from test_tokenize_run import records, write_jsonl

    os.environ["PACKER_CACHE_DIR"] = str(directory / "cache")
    from packer.tokenize.cache import tokenized_input
    from packer.tokenize.encode import Encoder

    tok = _tokenizer(directory)
    raw = write_jsonl(directory / "raw.jsonl", records(1500, seed=1))
    result = tokenized_input([raw], Encoder(str(tok)), workers=1)
    return Path(result.output)


def _tokenizer(directory: Path) -> Path:
    from test_tokenize_run import CHATML, WORDS
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    special = ["<unk>", "<pad>", "<eos>", "<|im_start|>", "<|im_end|>"]
    words = WORDS + ["user", "assistant", "system"]
    tok.train_from_iterator([" ".join(words)], trainers.WordLevelTrainer(special_tokens=special))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        pad_token="<pad>",
        eos_token="<eos>",
        additional_special_tokens=special[3:],
    )
    fast.chat_template = CHATML
    path = directory / "tok"
    if not path.exists():
        fast.save_pretrained(str(path))
    return path


def _entry_rows(tmp: Path, runs: int) -> list[tuple[str, str, str, str]]:
    from packer.tokenize.output import read_tokenized, unsound

    rows = []
    for label, entry in (
        ("~100 MB entry", _random_entry(tmp / "big", 100)),
        ("1,500-line chat entry", _chat_entry(tmp)),
    ):
        manifest = read_tokenized(entry)
        size = sum(p.stat().st_size for p in entry.glob("part-*.parquet"))
        assert unsound(entry, manifest) is None  # warm the page cache, and sound
        before = _median(lambda e=entry: read_tokenized(e), runs)
        after = _median(lambda e=entry, m=manifest: (read_tokenized(e), unsound(e, m)), runs)
        per_100mb = (after - before) * 1e3 * (100 << 20) / size
        rows.append(
            (
                f"{label} ({size / 1e6:.2f} MB)",
                f"{before * 1e3:.2f}",
                f"{after * 1e3:.2f}",
                f"{per_100mb:.1f}" if size >= 1 << 20 else "-",
            )
        )
    return rows


def _resume_rows(tmp: Path, runs: int) -> list[tuple[str, str, str, str]]:
    from test_tokenize_run import records, write_jsonl

    from packer.tokenize.encode import Encoder
    from packer.tokenize.files import batch_digest, raw_inputs, read_batches
    from packer.tokenize.records import RawColumns
    from packer.tokenize.worker import setup, tokenize_batch

    raw = write_jsonl(tmp / "batch.jsonl", records(1024, seed=2))
    (file,) = raw_inputs([raw])
    columns = RawColumns()
    names = [getattr(columns, f) for f in columns.__dataclass_fields__]
    (batch,) = list(read_batches(file, 0, names))
    setup(Encoder(str(_tokenizer(tmp))).spec, columns, "error")
    out = tmp / "shards"
    out.mkdir()
    hashed = _median(lambda: batch_digest(batch), runs)
    tokenized = _median(lambda: tokenize_batch(batch, str(out)), runs)
    size = raw.stat().st_size
    return [
        (
            f"one batch: 1,024 JSONL lines ({size / 1e3:.0f} kB)",
            f"{tokenized * 1e3:.1f}",
            f"{hashed * 1e3:.3f}",
            f"{100 * hashed / tokenized:.3f} %",
        )
    ]


def _verify_rows(tmp: Path, runs: int) -> list[tuple[str, str, str, str]]:
    import logging
    import os

    try:
        import boto3
        from moto.server import ThreadedMotoServer
    except ImportError:
        return []
    from conftest import make_samples, write_jsonl

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        os.environ.update(
            AWS_ENDPOINT_URL=f"http://{host}:{port}",
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing-secret",
            AWS_DEFAULT_REGION="us-east-1",
            PACKER_CACHE_DIR=str(tmp / "remote-cache"),
        )
        boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"]).create_bucket(
            Bucket="bench"
        )
        from packer import PackConfig, pack
        from packer.contract.remote import local_copy
        from packer.verify import verify

        data = write_jsonl(tmp / "tokens.jsonl", make_samples(20_000, seed=1, median=200))
        pack([str(data)], "s3://bench/out", PackConfig(max_len=4096, overlength="split"))
        local = local_copy("s3://bench/out")
        size = sum(p.stat().st_size for p in local.iterdir() if p.name.startswith("shard-"))
        warm = _median(lambda: local_copy("s3://bench/out"), runs)
        store = _median(lambda: local_copy("s3://bench/out", check_store=True), runs)
        checks = _median(lambda: verify(local, attention=False), runs)
    finally:
        server.stop()
    return [
        (
            f"s3 output ({size / 1e6:.1f} MB of shards)",
            f"{warm * 1e3:.1f}",
            f"{store * 1e3:.1f}",
            f"{checks * 1e3:.1f}",
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        entry = _entry_rows(tmp, args.runs)
        resume = _resume_rows(tmp, args.runs)
        remote = _verify_rows(tmp, args.runs)
    print(f"(a) cache entry lookup, median of {args.runs} (ms)")
    print(f"{'entry':<34} {'tokenized.json only':>20} {'+ shard hashes':>15} {'ms / 100 MB':>12}")
    for row in entry:
        print(f"{row[0]:<34} {row[1]:>20} {row[2]:>15} {row[3]:>12}")
    print(f"\n(b) resumed batch check, median of {args.runs} (ms)")
    print(f"{'batch':<34} {'tokenize':>20} {'input hash':>15} {'share':>12}")
    for row in resume:
        print(f"{row[0]:<34} {row[1]:>20} {row[2]:>15} {row[3]:>12}")
    if remote:
        print(f"\n(c) verify of a remote output, median of {args.runs} (ms)")
        print(f"{'output':<34} {'warm copy':>20} {'store read':>15} {'checks':>12}")
        for row in remote:
            print(f"{row[0]:<34} {row[1]:>20} {row[2]:>15} {row[3]:>12}")


if __name__ == "__main__":
    main()

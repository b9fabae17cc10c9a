"""Digests of every kind of output packer writes, to prove that a change leaves the bytes alone.

Packs the bundled sample (and a few small generated inputs) every way packer can: one global
plan, padded, each over-length policy, `--on-error skip`, blocks, out of core, a repack, Ray
(with --ray), `pack_dataset` on lists, tables and a file-backed `datasets.Dataset`; digests
every file of each output and each `--json` report (timings removed), and prints a table.

    python scripts/output_digests.py --save before.json        # on the old code
    python scripts/output_digests.py --compare before.json     # on the new: exit 1 on a change

`--row-order plan|shuffle` passes that row order to every case (on code that has the option);
`--ignore-manifest-key format_version --ignore-manifest-key config.row_order` digests each
manifest.json without those keys (re-serialised canonically, on both sides of a comparison),
to show that nothing else changed. `--rows` digests each output's multiset of rows instead of
its bytes: the same for any row order.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample.jsonl.gz"
TIMING = (
    "timings",
    "seconds",
    "elapsed",
    "per_second",
    "time",
    "rss",
    "memory",
    "peak",
)  # key parts


IGNORED: list[str] = []  # dotted manifest keys left out of its digest (--ignore-manifest-key)
ROWS = False  # digest the multiset of rows, not the bytes (--rows)
ROW_ORDER: str | None = None  # --row-order passed to every case


def manifest_bytes(data: bytes) -> bytes:
    """manifest.json without the IGNORED keys, as canonical JSON (its bytes when none)."""
    if not IGNORED:
        return data
    manifest = json.loads(data)
    for key in IGNORED:
        *parents, last = key.split(".")
        node = manifest
        for part in parents:
            node = node.get(part, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(last, None)
    return json.dumps(manifest, sort_keys=True).encode()


def row_multiset(path: Path) -> bytes:
    """The output's rows as a sorted list of their digests (row order and shard cuts left out)."""
    import pyarrow as pa

    manifest = json.loads((path / "manifest.json").read_bytes())
    rows = []
    for shard in manifest["shards"]:
        with pa.memory_map(str(path / shard["file"])) as source:
            table = pa.ipc.open_stream(source).read_all()
        columns = [table.column(n).to_pylist() for n in table.column_names]
        rows += [hashlib.sha256(repr(r).encode()).digest() for r in zip(*columns)]
    return b"".join(sorted(rows))


def digest_dir(path: Path) -> str:
    h = hashlib.sha256()
    if ROWS:
        h.update(row_multiset(path))
        return h.hexdigest()[:16]
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        data = f.read_bytes()
        if f.name == "manifest.json":
            data = manifest_bytes(data)
        h.update(f.relative_to(path).as_posix().encode() + b"\0" + data + b"\0")
    return h.hexdigest()[:16]


def strip_timings(value):
    """A report without what changes from run to run (timings, memory, paths of temp dirs)."""
    if isinstance(value, dict):
        return {k: strip_timings(v) for k, v in value.items() if not any(t in k for t in TIMING)}
    if isinstance(value, list):
        return [strip_timings(v) for v in value]
    return value


def digest_json(text: str, tmp: Path) -> str:
    report = strip_timings(json.loads(text))
    if ROWS and isinstance(report, dict):  # each shard's rows and hash follow the row order
        report.pop("shards", None)
    canon = json.dumps(report, sort_keys=False).replace(str(tmp), "TMP")
    return hashlib.sha256(canon.encode()).hexdigest()[:16]


def pack(tmp: Path, name: str, args: list[str]) -> tuple[str, str]:
    out = tmp / name
    cmd = [sys.executable, "-m", "packer", "pack", *args, "-o", str(out), "--json"]
    if ROW_ORDER is not None:
        cmd += ["--row-order", ROW_ORDER]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if res.returncode != 0:
        raise SystemExit(f"{name}: exit {res.returncode}: {res.stderr.strip()}")
    return digest_dir(out), digest_json(res.stdout, tmp)


def cli_cases(tmp: Path, ray: bool) -> dict[str, tuple[str, str]]:
    bad = tmp / "bad.jsonl"
    lines = [json.dumps({"input_ids": list(range(1, 2 + i % 50))}) for i in range(300)]
    lines[7] = json.dumps({"input_ids": [1, -5, 3]})
    lines[99] = "not json"
    bad.write_text("\n".join(lines) + "\n")
    s = str(tmp / SAMPLE.name)  # a copy: manifests record input paths, not the checkout's
    shutil.copyfile(SAMPLE, s)
    cases = {
        "split 4096": [s, "-L", "4096", "--overlength", "split"],
        "ctx4k preset": [s, "--config", "configs/ctx4k.yaml"],
        "ctx2k padded preset": [s, "--config", "configs/ctx2k-padded.yaml"],
        "truncate 512": [s, "-L", "512", "--overlength", "truncate"],
        "drop 512 ffd": [s, "-L", "512", "--overlength", "drop", "--strategy", "ffd"],
        "split 1024 shards": [s, "-L", "1024", "--overlength", "split", "--shard-rows", "100"],
        "window ff-shuffle": [
            s,
            "-L",
            "4096",
            "--overlength",
            "split",
            "--strategy",
            "ff-shuffle",
            "--window",
            "300",
            "--seed",
            "3",
        ],
        "sha256": [s, "-L", "4096", "--overlength", "split", "--hash", "sha256"],
        "on-error skip": [str(bad), "-L", "64", "--on-error", "skip"],
        "blocks": [s, "-L", "4096", "--overlength", "split", "--block-size", "128KiB"],
        "out of core": [s, "-L", "4096", "--overlength", "split", "--memory-budget", "1MiB"],
    }
    found = {name: pack(tmp, name.replace(" ", "-"), args) for name, args in cases.items()}
    found["repack 1024->4096"] = pack(
        tmp, "repack", [str(tmp / "split-1024-shards"), "-L", "4096", "--repack"]
    )
    found["repack of truncate"] = pack(
        tmp, "repack-t", [str(tmp / "truncate-512"), "-L", "2048", "--repack"]
    )
    if ray:
        found["ray blocks"] = pack(
            tmp,
            "ray",
            [
                s,
                "-L",
                "4096",
                "--overlength",
                "split",
                "--block-size",
                "128KiB",
                "--engine",
                "ray",
                "--workers",
                "2",
            ],
        )
    return found


def library_cases(tmp: Path) -> dict[str, tuple[str, str]]:
    import numpy as np
    import pyarrow as pa

    import packer

    rng = np.random.default_rng(0)
    lists = [rng.integers(1, 1000, int(n)).tolist() for n in rng.lognormal(4, 1, 2000) + 1]
    table = pa.table({"input_ids": lists})

    def ipc(t) -> str:
        if ROWS:
            columns = [t.column(n).to_pylist() for n in t.column_names]
            rows = sorted(hashlib.sha256(repr(r).encode()).digest() for r in zip(*columns))
            return hashlib.sha256(b"".join(rows)).hexdigest()[:16]
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, t.schema) as w:
            w.write_table(t)
        return hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()[:16]

    found = {}
    order = {} if ROW_ORDER is None else {"row_order": ROW_ORDER}
    packed, stats = packer.pack_dataset(lists, 512, overlength="split", return_stats=True, **order)
    found["pack_dataset lists"] = (ipc(packed), digest_json(json.dumps(stats), tmp))
    packed, stats = packer.pack_dataset(
        table, 512, overlength="truncate", pad=True, return_stats=True, **order
    )
    found["pack_dataset table padded"] = (ipc(packed), digest_json(json.dumps(stats), tmp))
    batches = packer.pack_dataset(iter(lists), 512, overlength="drop", window=500, **order)
    found["pack_dataset iterator"] = (ipc(pa.Table.from_batches(list(batches))), "-")
    try:
        import datasets
    except ImportError:
        return found
    ds = datasets.Dataset.from_dict({"input_ids": lists})
    ds.save_to_disk(str(tmp / "ds"))
    on_disk = datasets.load_from_disk(str(tmp / "ds"))
    cache = tmp / "cache.arrow"
    packed = packer.pack_dataset(
        on_disk, 512, overlength="split", cache_file_name=str(cache), **order
    )
    with pa.memory_map(str(cache)) as source:
        cached = pa.ipc.open_stream(source).read_all()
    found["pack_dataset cache file"] = (
        ipc(cached) if ROWS else hashlib.sha256(cache.read_bytes()).hexdigest()[:16],
        ipc(packed.data.table),
    )
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--save", type=Path, help="write the digests to this JSON file")
    ap.add_argument("--compare", type=Path, help="compare with digests saved by --save")
    ap.add_argument("--ray", action="store_true", help="also pack on a local Ray")
    ap.add_argument(
        "--workdir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "packer-digests",
        help="where the outputs are written (removed before and after)",
    )
    ap.add_argument(
        "--row-order",
        choices=("shuffle", "plan"),
        help="pass this row order to every case (default: none passed, the code's default)",
    )
    ap.add_argument(
        "--ignore-manifest-key",
        action="append",
        default=[],
        metavar="KEY",
        help="a dotted manifest key (config.row_order) left out of each manifest's digest",
    )
    ap.add_argument(
        "--rows",
        action="store_true",
        help="digest each output's multiset of rows (and its report without shards), not bytes",
    )
    opts = ap.parse_args()
    global ROWS, ROW_ORDER
    IGNORED.extend(opts.ignore_manifest_key)
    ROWS, ROW_ORDER = opts.rows, opts.row_order
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # a fixed place, the sample copied into it: manifests record the paths of their inputs, so
    # digests saved from another checkout (an older commit's worktree) compare with these
    tmp = opts.workdir.absolute()
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        found = {**cli_cases(tmp, opts.ray), **library_cases(tmp)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    before = json.loads(opts.compare.read_text()) if opts.compare else {}
    changed = 0
    print(f"{'output':<28} {'files':<17} {'report':<17} {'vs saved' if before else ''}")
    for name, (files, report) in found.items():
        mark = ""
        if before:
            old = before.get(name)
            mark = "new" if old is None else ("same" if list(old) == [files, report] else "CHANGED")
            changed += mark == "CHANGED"
        print(f"{name:<28} {files:<17} {report:<17} {mark}")
    if opts.save:
        opts.save.write_text(json.dumps(found, indent=1) + "\n")
    if before:
        print(f"{changed} of {len(found)} changed")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())

"""`packer export` trusts only what was packed: a shard changed after packing, an id outside
the vocabulary, an output replaced while it is read, an output without rows and a destination
inside the output are each one line, a non-zero exit and nothing written."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import make_samples, write_jsonl

import packer
from packer.cli import app
from packer.errors import InputError
from packer.export import EXPORT_MANIFEST, export

L = 256
FORMATS = ("trl", "megatron", "mds", "megatron-bridge")
pytestmark = pytest.mark.xdist_group("export")


def pack_of(root: Path, name: str, seed: int, n: int = 160) -> Path:
    """An output of several shards packed from `n` fresh samples."""
    src = write_jsonl(root / f"{name}.jsonl", make_samples(n, seed=seed, median=60, max_len=L))
    out = root / name
    packer.pack([src], out, packer.PackConfig(max_len=L, shard_rows=8))
    return out


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    return pack_of(tmp_path_factory.mktemp("trust"), "packed", seed=5)


def shards_of(out: Path) -> list[Path]:
    manifest = json.loads((out / "manifest.json").read_text())
    return [out / entry["file"] for entry in manifest["shards"]]


def change_one_token(shard: Path) -> None:
    """Rewrite the shard with one input id changed: the same size, one token different."""
    with pa.ipc.open_stream(pa.py_buffer(shard.read_bytes())) as reader:  # not mapped: rewritten
        schema, batches = reader.schema, list(reader)
    first = batches[0]
    ids = first.column("input_ids")
    values = ids.values.to_numpy().copy()
    values[3] += 1
    changed = pa.ListArray.from_arrays(ids.offsets, pa.array(values, pa.int32()))
    columns = [changed if n == "input_ids" else first.column(n) for n in schema.names]
    batches[0] = pa.RecordBatch.from_arrays(columns, schema=schema)
    size = shard.stat().st_size
    with pa.OSFile(str(shard), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    assert shard.stat().st_size == size


def nothing_written(dest: Path) -> bool:
    return not dest.exists() and not [p for p in dest.parent.iterdir() if f".{dest.name}" in p.name]


def packer_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "packer", *args], capture_output=True, text=True, timeout=300
    )


def test_a_shard_changed_after_packing_is_refused_and_named(packed, tmp_path, runner):
    bad = tmp_path / "bad"
    shutil.copytree(packed, bad)
    shard = shards_of(bad)[1]
    change_one_token(shard)
    dest = tmp_path / "dest"
    r = packer_cli("export", str(bad), "--to", "trl", "-o", str(dest))
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert str(shard) in lines[0] and "changed after packing" in lines[0]
    assert nothing_written(dest)
    for fmt in FORMATS[1:]:
        r = runner.invoke(app, ["export", str(bad), "--to", fmt, "-o", str(dest)])
        assert r.exit_code == 1, (fmt, r.output)
        assert str(shard) in r.output and "xxh3_128 differs from manifest.json" in r.output
        assert nothing_written(dest), fmt
    # the untouched output still exports
    assert export(packed, "mds", tmp_path / "good").rows > 0


def test_a_truncated_shard_names_the_source_not_the_destination(packed, tmp_path, runner):
    bad = tmp_path / "cut"
    shutil.copytree(packed, bad)
    shard = shards_of(bad)[0]
    size = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[: size // 2])
    dest = tmp_path / "dest"
    for fmt in ("mds", "trl"):
        r = runner.invoke(app, ["export", str(bad), "--to", fmt, "-o", str(dest)])
        assert r.exit_code == 1, r.output
        assert f"{shard}: {size // 2} bytes where manifest.json records {size}" in r.output
        assert str(dest) not in r.output and nothing_written(dest)


def test_megatron_refuses_ids_outside_the_vocabulary(tmp_path, runner):
    src = tmp_path / "big.jsonl"
    src.write_text('{"input_ids": [5, 6]}\n{"input_ids": [1, 2, 100000, 3]}\n')
    out = tmp_path / "big"
    packer.pack([src], out, packer.PackConfig(max_len=16))
    dest = tmp_path / "meg"
    r = runner.invoke(
        app, ["export", str(out), "--to", "megatron", "-o", str(dest)] + ["--vocab-size", "32000"]
    )
    assert r.exit_code == 1, r.output
    line = r.output.strip()
    assert "\n" not in line and "input id 100000" in line and "--vocab-size 32000" in line
    assert "row 0" in line and "stored as 34464" in line and nothing_written(dest)
    with pytest.raises(InputError, match="vocab_size 100000"):  # the library names the parameter
        export(out, "megatron", dest, vocab_size=100000)  # an id equal to the size is outside
    assert nothing_written(dest)
    result = export(out, "megatron", dest, vocab_size=100001)
    assert result.details == {"dtype": "int32", "vocab_size": 100001}
    shutil.rmtree(dest)
    assert export(out, "megatron", dest).details["vocab_size"] == 100001  # the largest id + 1


def test_an_output_replaced_mid_export_is_read_as_one_version(tmp_path):
    """`pack --overwrite` swaps a new output in after the export read its first batch: every
    row still comes from the version the export opened, and its manifest names that one."""
    old = pack_of(tmp_path, "out", seed=5)
    kept = tmp_path / "old-copy"
    shutil.copytree(old, kept)
    new_src = write_jsonl(tmp_path / "new.jsonl", make_samples(40, seed=6, median=60, max_len=L))
    old_sha = hashlib.sha256((old / "manifest.json").read_bytes()).hexdigest()
    swapped = []

    def progress(done: int, total: int) -> None:
        if not swapped:
            cfg = packer.PackConfig(max_len=L, shard_rows=8)
            packer.pack([new_src], old, cfg, overwrite=True)
            swapped.append(hashlib.sha256((old / "manifest.json").read_bytes()).hexdigest())

    dest = tmp_path / "mds"
    result = export(old, "mds", dest, progress=progress)
    assert swapped and swapped[0] != old_sha  # the output was replaced mid-export
    assert len(shards_of(kept)) > 2
    manifest = json.loads((dest / EXPORT_MANIFEST).read_text())
    assert manifest["source"]["manifest_sha256"] == old_sha
    alone = export(kept, "mds", tmp_path / "alone")
    assert result.rows == alone.rows and result.samples == alone.samples
    for name in ("index.json", "shard.00000.mds"):
        assert (dest / name).read_bytes() == (tmp_path / "alone" / name).read_bytes()


def test_an_output_replaced_while_it_is_opened_is_opened_again(tmp_path, monkeypatch):
    """The swap lands between the manifest and the shards: the old directory is gone with
    its files, so the export opens the new version whole instead of mixing the two."""
    import packer.export.source as source_module

    out = pack_of(tmp_path, "out", seed=5)
    new = pack_of(tmp_path, "new", seed=6, n=40)
    real_open_at, swaps = source_module._open_at, []

    def open_at(dir_fd, directory, name):
        if name != "manifest.json" and not swaps:
            swaps.append(name)
            shutil.rmtree(out)
            shutil.copytree(new, out)
        return real_open_at(dir_fd, directory, name)

    monkeypatch.setattr(source_module, "_open_at", open_at)
    dest = tmp_path / "trl"
    export(out, "trl", dest)
    manifest = json.loads((dest / EXPORT_MANIFEST).read_text())
    want = hashlib.sha256((new / "manifest.json").read_bytes()).hexdigest()
    assert swaps and manifest["source"]["manifest_sha256"] == want
    assert manifest["rows"] == sum(1 for _ in _rows(new))


def _rows(out: Path):
    for shard in shards_of(out):
        with pa.ipc.open_stream(pa.memory_map(str(shard))) as reader:
            for batch in reader:
                yield from range(batch.num_rows)


def test_an_output_replaced_on_object_storage_mid_copy_is_read_as_one_version(
    s3, tmp_path, monkeypatch
):
    from packer.storage.stores import S3Store

    src = write_jsonl(tmp_path / "a.jsonl", make_samples(160, seed=5, median=60, max_len=L))
    new_src = write_jsonl(tmp_path / "b.jsonl", make_samples(40, seed=6, median=60, max_len=L))
    cfg = packer.PackConfig(max_len=L, shard_rows=8)
    url = s3.url("packed")
    packer.pack([src], url, cfg)
    real_download, swapped = S3Store.download, []

    def download(self, path, local, on_bytes=None, **kwargs):
        if not swapped:  # the first file is the old run's: replaced, then deleted, under us
            packer.pack([new_src], url, cfg, overwrite=True)
            swapped.append(s3.get("packed/manifest.json"))
        return real_download(self, path, local, on_bytes, **kwargs)

    monkeypatch.setattr(S3Store, "download", download)
    dest = tmp_path / "mds"
    result = export(url, "mds", dest)
    manifest = json.loads((dest / EXPORT_MANIFEST).read_text())
    assert (
        swapped and manifest["source"]["manifest_sha256"] == hashlib.sha256(swapped[0]).hexdigest()
    )
    local = tmp_path / "local"
    packer.pack([new_src], local, cfg)
    assert result.rows == export(local, "mds", tmp_path / "local-mds").rows
    assert (dest / "shard.00000.mds").read_bytes() == (
        tmp_path / "local-mds" / "shard.00000.mds"
    ).read_bytes()


@pytest.fixture(scope="module")
def empty(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("empty")
    src = root / "one.jsonl"
    src.write_text('{"input_ids": [1, 2, 3]}\n')
    out = root / "empty"
    packer.pack([src], out, packer.PackConfig(max_len=2, overlength="drop"))
    assert json.loads((out / "manifest.json").read_text())["shards"] == []
    return out


def test_an_output_without_rows_exports_to_trl_as_an_empty_dataset(empty, tmp_path):
    import datasets

    dest = tmp_path / "trl"
    r = packer_cli("export", str(empty), "--to", "trl", "-o", str(dest), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["rows"] == 0
    ds = datasets.load_from_disk(str(dest))
    assert len(ds) == 0 and "seq_lengths" in ds.column_names


@pytest.mark.parametrize("fmt", ["mds", "megatron", "megatron-bridge"])
def test_an_output_without_rows_is_refused_where_the_reader_refuses_it(empty, tmp_path, fmt):
    dest = tmp_path / fmt
    r = packer_cli("export", str(empty), "--to", fmt, "-o", str(dest))
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "holds no rows" in lines[0] and "internal error" not in lines[0]
    assert nothing_written(dest)


def test_pack_refuses_an_export_output_inside_the_output_before_packing(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", make_samples(40, seed=9, median=40, max_len=200))
    out = tmp_path / "px"
    args = ["pack", str(src), "-o", str(out), "-L", "256", "--export", "trl"]
    r = packer_cli(*args, "--export-output", str(out / "trl"))
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and "--export-output must be outside the packer output" in line
    assert not out.exists()
    r = packer_cli(*args, "--export-output", str(tmp_path / "trl"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "trl" / EXPORT_MANIFEST).is_file()


def test_a_changed_copy_of_a_remote_output_names_the_url(s3, tmp_path, runner):
    from packer.contract.remote import local_copy

    src = write_jsonl(tmp_path / "a.jsonl", make_samples(60, seed=5, median=60, max_len=L))
    url = s3.url("p")
    packer.pack([src], url, packer.PackConfig(max_len=L))
    copy = local_copy(url)
    name = json.loads((copy / "manifest.json").read_text())["shards"][0]["file"]
    change_one_token(copy / name)
    dest = tmp_path / "mds"
    r = runner.invoke(app, ["export", url, "--to", "mds", "-o", str(dest)])
    assert r.exit_code == 1, r.output
    assert f"{url}/{name}: its xxh3_128 differs" in r.output and "PACKER_CACHE_DIR" in r.output
    assert nothing_written(dest)


def test_every_shard_is_held_open_under_a_low_open_file_limit(tmp_path):
    """Export holds every shard open: a soft limit below that is raised, a hard one refused."""
    src = write_jsonl(tmp_path / "in.jsonl", make_samples(300, seed=4, median=150, max_len=L))
    out = tmp_path / "many"
    packer.pack([src], out, packer.PackConfig(max_len=L, shard_rows=1))
    shards = len(shards_of(out))
    assert shards > 150
    command = f"{sys.executable} -m packer export {out} --to trl -o {{dest}} --json"

    def run(limits: str, dest: Path) -> subprocess.CompletedProcess:
        line = f"{limits}; " + command.format(dest=dest)
        return subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=300)

    r = run("ulimit -Sn 64", tmp_path / "soft")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["rows"] == shards
    r = run(f"ulimit -n {shards + 100}", tmp_path / "hard")
    assert r.returncode == 1, r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and f"open-file limit is {shards + 100}" in line
    assert nothing_written(tmp_path / "hard")


def test_the_readers_refuse_the_empty_files_their_formats_would_hold(tmp_path):
    """Why mds and megatron refuse an output without rows: the trainers' own readers fail on
    the empty files (what streaming's MDSWriter writes for 0 samples; an empty .bin)."""
    from export_checks import readers_python

    from packer.export.mds import MdsWriter
    from packer.export.megatron import MegatronWriter

    python = readers_python()
    if python is None:
        pytest.skip("the readers' virtualenv (scripts/readers_venv.py) cannot be built here")
    (tmp_path / "mds").mkdir()
    MdsWriter(tmp_path / "mds").finish()
    (tmp_path / "meg").mkdir()
    MegatronWriter(tmp_path / "meg", 32000).finish()
    reader = Path(__file__).parent / "consumer_readers.py"
    for args, why in (
        (["mds", tmp_path / "mds"], "contains no samples"),
        (["megatron", tmp_path / "meg"], "cannot mmap an empty file"),
    ):
        r = subprocess.run(
            [str(python), str(reader), *map(str, args)], capture_output=True, text=True, timeout=300
        )
        assert r.returncode != 0 and why in r.stderr, r.stderr[-2000:]

"""`--tp-size T --sequence-parallel`: with sequence parallelism Megatron-Bridge asks for every
sub-sequence padded to lcm(2 x cp_size, cp_size x tp_size), even at cp_size 1. packer pads to
it, records it in the manifest, verify checks it, and the Bridge export stores it as its
pad_seq_to_mult. Without --sequence-parallel, --tp-size changes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from conftest import make_samples, write_jsonl
from export_checks import bridge_collate_cp, bridge_read

import packer
from packer.errors import UsageError
from packer.export import export
from packer.planning.cp import cp_multiple
from packer.verify import verify

L = 256
EOS = 1000  # above make_samples' ids


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    root = tmp_path_factory.mktemp("sp")
    return write_jsonl(root / "in.jsonl", make_samples(300, seed=7, median=40, max_len=200))


def segments(out: Path) -> tuple[np.ndarray, np.ndarray]:
    """Every sample's padded and real length, over all rows of an output."""
    padded, real = [], []
    manifest = json.loads((out / "manifest.json").read_text())
    for entry in manifest["shards"]:
        table = pa.ipc.open_stream(pa.memory_map(str(out / entry["file"]))).read_all()
        for row in table.to_pylist():
            n = len(row["sample_index"])
            padded += np.diff(row["cu_seqlens_padded"])[:n].tolist()
            real += np.diff(row["cu_seqlens"])[:n].tolist()
    return np.array(padded), np.array(real)


@pytest.mark.parametrize(
    "cp, tp, sp, want",
    [(1, 4, True, 4), (2, 4, True, 8), (2, 4, False, 4), (1, 4, False, 1), (4, 2, True, 8)],
)
def test_the_multiple_is_bridges(cp, tp, sp, want):
    assert cp_multiple(cp, tp, sp) == want


@pytest.mark.parametrize("cp, want", [(1, 4), (2, 8)])
def test_sequence_parallel_pads_to_the_multiple(src, tmp_path, cp, want):
    out = tmp_path / "out"
    cfg = packer.PackConfig(max_len=L, cp_size=cp, tp_size=4, sequence_parallel=True)
    packer.pack([src], out, cfg)
    padded, real = segments(out)
    assert np.all(padded % want == 0) and np.all((padded - real >= 0) & (padded - real < want))
    assert np.any(padded % (2 * want) != 0)  # padded to `want`, not more
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["tp_size"] == 4 and manifest["config"]["sequence_parallel"] is True
    assert manifest["stats"]["segment_multiple"] == want
    assert verify(out, inputs=[src], attention=False).ok


def test_tp_size_alone_changes_nothing(src, tmp_path):
    plain, with_tp = tmp_path / "plain", tmp_path / "tp"
    packer.pack([src], plain, packer.PackConfig(max_len=L, cp_size=2))
    packer.pack([src], with_tp, packer.PackConfig(max_len=L, cp_size=2, tp_size=4))
    for path in sorted(plain.iterdir()):
        assert path.read_bytes() == (with_tp / path.name).read_bytes(), path.name


def test_cli_and_yaml(src, tmp_path, cli):
    out = tmp_path / "cli"
    r = cli("pack", src, "-o", out, "-L", L, "--tp-size", "4", "--sequence-parallel")
    assert r.exit_code == 0, r.stderr
    assert np.all(segments(out)[0] % 4 == 0)
    yaml_cfg = tmp_path / "sp.yaml"
    yaml_cfg.write_text(f"max_len: {L}\ntp_size: 4\nsequence_parallel: true\n")
    r = cli("pack", src, "-o", tmp_path / "yaml", "--config", yaml_cfg)
    assert r.exit_code == 0, r.stderr
    for path in sorted(out.iterdir()):
        assert path.read_bytes() == (tmp_path / "yaml" / path.name).read_bytes(), path.name
    r = cli(
        "pack", src, "-o", tmp_path / "bad", "-L", "250", "--tp-size", "4", "--sequence-parallel"
    )
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert "--max-len 250 must be a multiple of --cp-size x --tp-size = 4" in r.stderr
    assert not (tmp_path / "bad").exists()
    r = cli("pack", src, "-o", tmp_path / "bad", "-L", L, "--tp-size", "0")
    assert r.exit_code == 2 and "--tp-size" in r.stderr and r.stderr.count("\n") == 1
    with pytest.raises(UsageError, match=r"lcm\(2 x cp_size, cp_size x tp_size\) = 8"):
        packer.PackConfig(max_len=252, cp_size=2, tp_size=4, sequence_parallel=True).validate()


def test_plan_reports_the_padding(src, cli):
    r = cli("plan", src, "-L", L, "--tp-size", "4", "--sequence-parallel", "--json")
    assert r.exit_code == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["cp"]["multiple"] == 4 and report["cp"]["cp_pad_tokens"] > 0
    r = cli("plan", src, "-L", L, "--tp-size", "4", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["cp"] is None


def test_verify_checks_the_sequence_parallel_padding(src, tmp_path):
    """An output padded for cp 2 alone (multiple 4) whose manifest says tp 4 with sequence
    parallelism (multiple 8) fails, naming the multiple."""
    out = tmp_path / "out"
    packer.pack([src], out, packer.PackConfig(max_len=L, cp_size=2))
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["config"].update(tp_size=4, sequence_parallel=True)
    (out / "manifest.json").write_text(json.dumps(manifest))
    result = verify(out, attention=False)
    msgs = [f.message for f in result.checks["structure"].failures]
    assert not result.ok
    assert any("not a multiple of lcm(2 x cp_size, cp_size x tp_size) = 8" in m for m in msgs)


def test_bridge_export_pads_to_the_multiple(src, tmp_path):
    out = tmp_path / "out"
    packer.pack([src], out, packer.PackConfig(max_len=L, tp_size=4, sequence_parallel=True))
    dest = tmp_path / "bridge"
    with pytest.raises(UsageError, match="eos_id is needed"):  # the layout pads with EOS
        export(out, "megatron-bridge", dest)
    result = export(out, "megatron-bridge", dest, eos_id=EOS)
    assert any("pad_seq_to_mult = 4" in note for note in result.notes)
    metadata = json.loads((dest / "packing_metadata.json").read_text())[0]
    assert metadata["pad_seq_to_mult"] == 4
    padded, real = segments(out)
    seen = []
    for item in bridge_read(dest):
        b = bridge_collate_cp(item, L, eos_id=EOS)
        seg = np.diff(b["cu_seqlens_padded"])
        assert b["cu_seqlens_padded"][-1] == L and np.all(seg % 4 == 0)
        n = len(item["seq_boundaries"]) - 1
        seen += np.diff(b["cu_seqlens"])[:n].tolist()
    # the model sees each sample's real tokens (all but a last token that only is a target)
    assert np.all((real - np.array(seen) >= 0) & (real - np.array(seen) <= 1))
    trl = export(out, "trl", tmp_path / "trl")
    assert any("--tp-size 4 --sequence-parallel" in note for note in trl.notes)


def test_pack_export_to_bridge_with_sequence_parallel_is_refused(src, tmp_path, cli):
    args = ["pack", src, "-o", tmp_path / "out", "-L", L, "--tp-size", "4", "--sequence-parallel"]
    r = cli(*args, "--export", "megatron-bridge")
    assert r.exit_code == 2 and "--sequence-parallel" in r.stderr and "--eos-id" in r.stderr
    assert not (tmp_path / "out").exists()


def test_repack_refuses_a_sequence_parallel_output(src, tmp_path, cli):
    out = tmp_path / "out"
    packer.pack([src], out, packer.PackConfig(max_len=L, tp_size=4, sequence_parallel=True))
    r = cli("pack", out, "-o", tmp_path / "again", "-L", L, "--repack")
    assert r.exit_code != 0 and "sequence_parallel" in r.stderr and r.stderr.count("\n") == 1

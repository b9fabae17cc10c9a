"""`packer inspect`: the summary, histograms and row views agree with the shards and sources."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import make_samples, read_shards, write_jsonl, write_parquet

from packer.contract.names import IGNORE_INDEX
from packer.errors import EXIT_USAGE


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> tuple[Path, list[dict]]:
    d = tmp_path_factory.mktemp("inspect")
    a, b = make_samples(150, seed=1, median=80), make_samples(100, seed=2, median=80)
    write_jsonl(d / "a.jsonl", a)
    write_parquet(d / "b.parquet", b)
    out = d / "out"
    from typer.testing import CliRunner

    from packer.cli import app

    args = ["pack", str(d / "a.jsonl"), str(d / "b.parquet"), "-o", str(out), "-L", "256"]
    result = CliRunner().invoke(app, [*args, "--overlength", "split", "--pad"])
    assert result.exit_code == 0, result.output
    return out, a + b


def test_json_report_matches_the_shards(cli, packed):
    out, samples = packed
    table = read_shards(out).to_pydict()
    n = len(table["input_ids"])
    rows = [0, n // 2, n - 1]
    result = cli("inspect", out, *[x for r in rows for x in ("--row", str(r))], "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["rows"] == n and report["config"]["max_len"] == 256
    assert report["stats"]["samples_in"] == 250

    fill = report["histograms"]["row_fill"]
    assert sum(b["rows"] for b in fill) == n
    assert fill[-1]["rows"] >= 1  # bfd fills most rows
    segs = {b["segments"]: b["rows"] for b in report["histograms"]["segments_per_row"]}
    expected = {}
    for sidx in table["sample_index"]:
        expected[len(sidx)] = expected.get(len(sidx), 0) + 1
    assert segs == expected

    assert [v["row"] for v in report["row_views"]] == rows
    for view in report["row_views"]:
        r = view["row"]
        cu, labels = table["cu_seqlens"][r], table["labels"][r]
        assert view["tokens"] == len(table["input_ids"][r]) == 256  # padded
        assert view["loss_tokens"] == table["num_loss_tokens"][r]
        for k, seg in enumerate(view["segments"]):
            a, e = cu[k], cu[k + 1]
            assert seg["length"] == e - a
            lab = np.array(labels[a:e])
            assert seg["loss_tokens"] == int((lab != IGNORE_INDEX).sum())
            masked = np.zeros(e - a, bool)
            for s, t in seg["masked"]:
                masked[s:t] = True
            assert (masked == (lab == IGNORE_INDEX)).all()
            if seg.get("padding"):
                assert k == len(cu) - 2
                continue
            index = seg["sample_index"]
            assert index == table["sample_index"][r][k]
            src = seg["source"]
            if index < 150:  # JSONL: one sample per line
                assert src == {"file": str(out.parent / "a.jsonl"), "line": index + 1}
            else:
                assert src == {"file": str(out.parent / "b.parquet"), "row": index - 150}
            off = seg["sample_offset"]
            assert table["input_ids"][r][a:e] == samples[index]["input_ids"][off : off + e - a]


def test_terminal_view_and_world_size(cli, packed):
    out, _ = packed
    result = cli("inspect", out, "--row", "1", "--world-size", "4")
    assert result.exit_code == 0, result.output
    text = result.stdout
    for part in ("row fill", "segments per row", "row 1 (shard-00000.arrow", "DP efficiency"):
        assert part in text
    data = json.loads(cli("inspect", out, "--world-size", "4", "--json").stdout)
    dp = data["dp_efficiency"]
    assert dp["world_size"] == 4 and 0 < dp["tokens"] <= 1 and 0 < dp["attention"] <= 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["--row", "100000"], "out of range"),
        (["--row", "-1"], "out of range"),
        (["--tokenizer", "/nonexistent/tokenizer.json"], "no tokenizer.json"),
        (["--world-size", "0"], "--world-size"),
    ],
)
def test_bad_options_are_one_line(cli, packed, args, message):
    out, _ = packed
    result = cli("inspect", out, *args)
    assert result.exit_code == EXIT_USAGE
    assert message in result.stderr and result.stderr.count("\n") == 1


def test_not_a_packer_output(cli, tmp_path: Path):
    result = cli("inspect", tmp_path)
    assert result.exit_code == EXIT_USAGE and "not a packer output" in result.stderr


def word_tokenizer(path: Path, vocab: int = 1000) -> Path:
    """A local tokenizer.json whose token i is the word `w<i>`."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))
    return path


def test_tokenizer_decodes_segments_with_masked_runs(cli, packed, tmp_path: Path):
    out, samples = packed
    tok = word_tokenizer(tmp_path / "tokenizer.json")
    report = json.loads(cli("inspect", out, "--row", "2", "--tokenizer", tok, "--json").stdout)
    for seg in report["row_views"][0]["segments"]:
        if seg.get("padding"):
            continue
        ids = samples[seg["sample_index"]]["input_ids"][seg["sample_offset"] :][: seg["length"]]
        words = " ".join(run["text"] for run in seg["text"]).split()
        assert words == [f"w{i}" for i in ids]
        assert seg["text"][0]["masked"] is True  # the first label of a sample is always -100
        masked_words = sum(len(run["text"].split()) for run in seg["text"] if run["masked"])
        assert masked_words == seg["length"] - seg["loss_tokens"]
    text = cli("inspect", out, "--row", "2", "--tokenizer", tmp_path).stdout
    assert "(label-masked text" in text and re.search(r"(?m)^sample \d+: «w", text)


def test_html_page_is_self_contained(cli, packed, tmp_path: Path):
    out, _ = packed
    page = tmp_path / "report.html"
    result = cli("inspect", out, "--row", "0", "--row", "3", "--html", page)
    assert result.exit_code == 0, result.output
    html = page.read_text()
    assert html.count("<svg") == 2
    assert 'id="row-0"' in html and 'id="row-3"' in html
    for external in ("<script", "src=", "href=", "url(", "@import"):
        assert external not in html


@pytest.mark.skipif(shutil.which("chromium") is None, reason="headless Chromium not installed")
def test_html_renders_in_headless_chromium(cli, packed, tmp_path: Path):
    out, _ = packed
    page = tmp_path / "report.html"
    rows = ["1", "4", "7"]
    assert (
        cli("inspect", out, *[x for r in rows for x in ("--row", r)], "--html", page).exit_code == 0
    )
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
    dom = subprocess.run(
        ["chromium", *flags, "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert "packer inspect:" in dom and "rows by fill" in dom
    for r in rows:
        assert f"Row {r} (shard-00000.arrow" in dom


@pytest.fixture
def tiny(cli, tmp_path: Path) -> Path:
    """One row: a sample ending in <eos> (id 9) whose prompt is masked, and one with ids 20, 21."""
    samples = [
        {"input_ids": [1, 2, 3, 9], "labels": [-100, -100, 3, 9]},
        {"input_ids": [4, 20, 21], "labels": [-100, 20, 21]},
    ]
    out = tmp_path / "out"
    args = ["pack", write_jsonl(tmp_path / "a.jsonl", samples), "-o", out, "-L", 16]
    assert cli(*args).exit_code == 0
    return out


def eos_tokenizer(path: Path) -> Path:
    """Words w0..w8 and the special token <eos> as id 9: ten ids, so 20 and 21 are outside."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(9)} | {"<eos>": 9}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<eos>"])
    tok.save(str(path))
    return path


def test_tokenizer_shows_special_tokens(cli, tiny, tmp_path: Path):
    tok = eos_tokenizer(tmp_path / "tokenizer.json")
    report = json.loads(cli("inspect", tiny, "--tokenizer", tok, "--json").stdout)
    first = report["row_views"][0]["segments"][0]
    assert " ".join(run["text"] for run in first["text"]).split() == ["w1", "w2", "w3", "<eos>"]


def test_masked_text_is_marked_without_colour(cli, tiny, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "150")
    tok = eos_tokenizer(tmp_path / "tokenizer.json")
    result = cli("inspect", tiny, "--tokenizer", tok)
    assert result.exit_code == 0, result.stderr
    # the first token of every sample is masked (no label predicts it), here with its prompt
    assert "sample 0: «w1 w2»w3 <eos>" in result.stdout
    assert "«w4»" in result.stdout
    help_text = " ".join(cli("inspect", "--help").stdout.split())
    assert "between « » when piped" in help_text


def test_text_is_whole_at_80_columns(cli, tmp_path: Path, monkeypatch):
    """Each segment's text gets the terminal's width, not a narrow column: at 80 columns a long
    end-of-turn token is printed whole, never cut or folded."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    eot = "<|end_of_turn|>"
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(9)} | {eot: 9}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([eot])
    tok.save(str(tmp_path / "tokenizer.json"))
    samples = [{"input_ids": [1 + (i + k) % 8 for k in range(30)] + [9]} for i in range(4)]
    src = write_jsonl(tmp_path / "a-long-file-name-for-the-source-column.jsonl", samples)
    out = tmp_path / "out"
    assert cli("pack", src, "-o", out, "-L", 128).exit_code == 0
    monkeypatch.setenv("COLUMNS", "80")
    result = cli("inspect", out, "--row", "0", "--tokenizer", tmp_path / "tokenizer.json")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.count(eot) == 4
    assert max(len(line) for line in result.stdout.splitlines()) <= 80


def test_ids_outside_the_vocabulary_are_one_warning(cli, tiny, tmp_path: Path):
    tok = eos_tokenizer(tmp_path / "tokenizer.json")
    result = cli("inspect", tiny, "--tokenizer", tok)
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: row 0: 2 token ids are >= the tokenizer's vocabulary size 10; their text is "
        "not what was trained on (another tokenizer?)"
    ]
    report = json.loads(cli("inspect", tiny, "--tokenizer", tok, "--json").stdout)
    assert report["row_views"][0]["ids_outside_vocab"] == 2
    big = word_tokenizer(tmp_path / "big.json", vocab=100)
    assert "warning" not in cli("inspect", tiny, "--tokenizer", big).stderr


def test_html_labels_values_for_people(cli, packed, tmp_path: Path):
    import re

    out, _ = packed
    page = tmp_path / "report.html"
    assert cli("inspect", out, "--world-size", "2", "--html", page).exit_code == 0
    html = page.read_text()
    keys = re.findall(r"<tr><th>([^<]*)</th><td>", html)
    assert "rows / lower bound" in keys and "samples split" in keys and "pad rows to L" in keys
    assert [k for k in keys if "_" in k] == []  # no raw key (rows_over_lower_bound)
    values = re.findall(r"<th>[^<]*</th><td>([^<]*)</td>", html)
    assert not {"True", "False", "None"} & set(values)
    assert "—" in values  # config.window: none
    stats = json.loads((out / "manifest.json").read_text())["stats"]
    efficiency = dict(zip(keys, values))["efficiency (tokens / rows·L)"]
    assert efficiency == f"{100 * stats['efficiency']:.3f} %"
    assert str(stats["efficiency"]) not in html  # 0.995341 is not shown beside 99.53 %
    assert re.search(r"efficiency, balanced by tokens</th><td>\d+\.\d %<", html)


def test_html_axis_labels_do_not_overlap(cli, tmp_path: Path):
    import re

    # hundreds of short samples a row: the segments-per-row axis has ranges like "64-134"
    source = write_parquet(tmp_path / "a.parquet", make_samples(20000, seed=4, median=10))
    out, page = tmp_path / "out", tmp_path / "report.html"
    assert cli("pack", source, "-o", out, "-L", 4096).exit_code == 0
    assert cli("inspect", out, "--html", page).exit_code == 0
    for svg in re.findall(r"<svg.*?</svg>", page.read_text()):
        texts = re.findall(r'<text ([^>]*)y="([\d.]+)"([^>]*)>([^<]*)</text>', svg)
        axis_y = max(float(y) for _, y, _, _ in texts)
        axis = [(a + b, t) for a, y, b, t in texts if float(y) == axis_y]
        assert len(axis) > 1
        if all("rotate(" in attrs for attrs, _ in axis):
            continue
        xs = [float(re.search(r'x="([\d.]+)"', attrs).group(1)) for attrs, _ in axis]
        for (x0, (_, label)), x1 in zip(zip(xs, axis), xs[1:]):
            assert x1 - x0 >= 6.5 * len(label), f"axis label {label!r} runs into the next one"

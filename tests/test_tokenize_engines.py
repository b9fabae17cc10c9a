"""Tokenizer engines: fastokens is used only where it gives tokenizers' ids, proven on the
probe set of the tokenizer itself, cached per tokenizer; anything else falls back to `hf`
with one line (`auto`) or fails in one line (`fastokens`)."""

from __future__ import annotations

import json
import os
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("fastokens")
pytest.importorskip("tokenizers")

from engines_util import (  # noqa: E402
    ANTHROPIC_SPECIALS,
    PIECES,
    anthropic_backend,
    backend_from,
    generated_texts,
    tiny_backend,
)
from tokenizers_util import SPECIALS  # noqa: E402

from packer.errors import EXIT_USAGE, flag_names  # noqa: E402
from packer.tokenize import engines, proof  # noqa: E402
from packer.tokenize.engines import (  # noqa: E402
    EngineError,
    FastokensEngine,
    HFEngine,
    fallback_line,
    resolve_engine,
)


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_backend(tmp_path_factory.mktemp("tiny"))


def with_bos(backend):
    """The backend with a post-processor that adds a BOS (as Llama's does)."""
    from tokenizers import processors

    copy = backend.__class__.from_str(backend.to_str())
    bos = SPECIALS[0]
    copy.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, copy.token_to_id(bos))]
    )
    return copy


def assert_same_ids(backend, texts):
    hf, fast = HFEngine(backend), FastokensEngine.from_backend(backend)
    for special in (False, True):
        want = hf.encode_batch(texts, add_special_tokens=special)
        assert fast.encode_batch(texts, add_special_tokens=special) == want
        for engine in (hf, fast):
            values, offsets = engine.encode_flat(texts, add_special_tokens=special)
            assert [values[a:b].tolist() for a, b in zip(offsets, offsets[1:])] == want


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(st.lists(st.sampled_from([*PIECES, *SPECIALS]), max_size=25), min_size=1, max_size=20)
)
def test_same_ids_on_tiny_tokenizers(tiny, parts):
    texts = ["".join(p) for p in parts]
    assert_same_ids(tiny, texts)
    assert_same_ids(with_bos(tiny), texts)


def test_same_ids_on_a_smaller_vocabulary(tmp_path):
    assert_same_ids(tiny_backend(tmp_path, vocab_size=300), generated_texts(500, seed=1))


def test_same_ids_on_the_anthropic_vocabulary():
    backend = anthropic_backend(normalizer=False)
    specials = [ANTHROPIC_SPECIALS[0], "<META_START>", "<EOT>"]
    texts = generated_texts(2000, seed=2, specials=specials)
    assert_same_ids(backend, texts)
    assert resolve_engine("fastokens", backend, extra_texts=texts).name == "fastokens"


def test_padding_and_truncation_of_tokenizer_json_are_off(tiny):
    """A tokenizer.json may turn padding (to the batch's longest) and truncation on: every
    engine gives all of a text's tokens, and none that are not its own."""
    data = json.loads(tiny.to_str())
    data["padding"] = {
        "strategy": "BatchLongest",
        "direction": "Right",
        "pad_to_multiple_of": None,
        "pad_id": 0,
        "pad_type_id": 0,
        "pad_token": SPECIALS[0],
    }
    data["truncation"] = {
        "direction": "Right",
        "max_length": 4,
        "strategy": "LongestFirst",
        "stride": 0,
    }
    padded = backend_from(data)
    texts = ["hello", "hello world the of and water " * 3]
    assert [len(e.ids) for e in padded.encode_batch(texts)] == [4, 4]  # as the file says
    want = [tiny.encode(t, add_special_tokens=False).ids for t in texts]
    assert len(want[1]) > 4
    for engine in (HFEngine(padded), FastokensEngine.from_backend(padded)):
        assert engine.encode_batch(texts, add_special_tokens=False) == want
        values, offsets = engine.encode_flat(texts, add_special_tokens=False)
        assert [values[a:b].tolist() for a, b in zip(offsets, offsets[1:])] == want
    assert padded.padding is not None  # the caller's backend is left as it was
    assert resolve_engine("auto", padded).name == "fastokens"


def test_a_tokenizer_fastokens_cannot_load_falls_back_in_one_line():
    backend = anthropic_backend()  # as shipped: an NFKC normalizer, which fastokens lacks
    resolved = resolve_engine("auto", backend)
    assert resolved.name == "hf" and resolved.requested == "auto"
    assert "NFKC" in resolved.reason and "\n" not in resolved.reason
    with flag_names():
        line = fallback_line(resolved)
    assert line.startswith("--tokenizer-engine auto: tokenizing with hf, not fastokens (")
    with pytest.raises(EngineError) as raised:
        resolve_engine("fastokens", backend)
    message = str(raised.value)
    assert message.startswith("tokenizer_engine fastokens: fastokens cannot load this tokenizer")
    assert "NFKC" in message and "\n" not in message
    assert raised.value.exit_code == EXIT_USAGE


def test_a_model_fastokens_lacks_falls_back():
    from tokenizers import Tokenizer, models

    unigram = Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0), ("b", -2.0)], 0))
    resolved = resolve_engine("auto", unigram)
    assert resolved.name == "hf" and "Unigram" in resolved.reason
    with pytest.raises(EngineError, match="unsupported model type: Unigram"):
        resolve_engine("fastokens", unigram)


def test_fastokens_not_installed(tiny, monkeypatch):
    monkeypatch.setitem(sys.modules, "fastokens", None)  # import fastokens raises ImportError
    assert resolve_engine("auto", tiny).reason.startswith("fastokens is not installed")
    with pytest.raises(EngineError, match="fastokens is not installed"):
        resolve_engine("fastokens", tiny)


def test_hf_is_the_reference_and_a_bad_name_is_refused(tiny):
    assert resolve_engine("hf", tiny).name == "hf"
    with pytest.raises(EngineError, match="tokenizer_engine must be one of auto, hf, fastokens"):
        resolve_engine("rust", tiny)


def planted(monkeypatch, target: str):
    """fastokens gives one id wrong, on `target` only."""
    encode = FastokensEngine.encode_batch

    def wrong(self, texts, *, add_special_tokens):
        out = encode(self, texts, add_special_tokens=add_special_tokens)
        return [
            [i + 1 for i in ids[:1]] + ids[1:] if t == target else ids for t, ids in zip(texts, out)
        ]

    monkeypatch.setattr(FastokensEngine, "encode_batch", wrong)


def test_a_planted_difference_is_not_proven(tiny, monkeypatch):
    probes = proof.probe_texts(tiny)
    target = next(p for p in probes if p.startswith("don't"))
    planted(monkeypatch, target)
    resolved = resolve_engine("auto", tiny)
    assert resolved.name == "hf"
    n = probes.index(target)
    assert resolved.reason.startswith(
        f"fastokens gives other ids than tokenizers on probe {n} (\"don't"
    )
    assert "add_special_tokens=False): token 0 is" in resolved.reason
    with pytest.raises(EngineError, match=f"probe {n} "):
        resolve_engine("fastokens", tiny)


def test_a_difference_on_the_runs_own_texts_is_caught_even_when_cached(tiny, monkeypatch):
    texts = ["<|im_start|>user\nhello there<|im_end|>\n", "the water"]
    assert resolve_engine("auto", tiny, extra_texts=texts).name == "fastokens"
    planted(monkeypatch, texts[1])
    resolved = resolve_engine("auto", tiny, extra_texts=texts)
    assert resolved.name == "hf" and " on text 1 ('the water'" in resolved.reason


def test_a_text_the_reference_cannot_encode_is_left_out(tiny, monkeypatch):
    texts = ["the water", "a\ud800b", "hello"]  # a lone surrogate: tokenizers refuses it
    assert resolve_engine("auto", tiny, extra_texts=texts).name == "fastokens"
    planted(monkeypatch, "hello")
    resolved = resolve_engine("auto", tiny, extra_texts=texts)
    assert resolved.name == "hf" and " on text 2 ('hello'" in resolved.reason


def test_an_engine_that_raises_is_not_proven(tiny, monkeypatch):
    def fails(self, texts, *, add_special_tokens):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(FastokensEngine, "encode_batch", fails)
    resolved = resolve_engine("auto", tiny, cache=False)
    assert resolved.name == "hf" and resolved.reason == "fastokens fails on the probes: boom"


def counting(monkeypatch) -> list:
    calls = []
    probe = proof.probe_texts

    def counted(backend):
        calls.append(1)
        return probe(backend)

    monkeypatch.setattr(proof, "probe_texts", counted)
    return calls


def test_the_proof_is_cached_and_invalidated_when_the_tokenizer_changes(
    tmp_path, cache_dir, monkeypatch
):
    from tokenizers import AddedToken, Tokenizer

    calls = counting(monkeypatch)
    directory = tmp_path / "tok"
    backend = tiny_backend(directory)
    first = proof.prove_equal(HFEngine(backend), FastokensEngine.from_backend(backend), backend)
    assert first.equal and not first.cached and len(calls) == 1
    assert len(list((cache_dir / "engines").glob("*.json"))) == 1
    again = Tokenizer.from_file(str(directory / "tokenizer.json"))
    second = proof.prove_equal(HFEngine(again), FastokensEngine.from_backend(again), again)
    assert second.cached and second.equal and second.probes == first.probes and len(calls) == 1
    assert resolve_engine("auto", again).name == "fastokens" and len(calls) == 1

    again.add_tokens([AddedToken("<tool>", special=False)])  # the tokenizer's file changes
    again.save(str(directory / "tokenizer.json"))
    edited = Tokenizer.from_file(str(directory / "tokenizer.json"))
    third = proof.prove_equal(HFEngine(edited), FastokensEngine.from_backend(edited), edited)
    assert not third.cached and third.probes > first.probes and len(calls) == 2
    # the same JSON, other files (a digest from `files_digest`): probed again
    resolve_engine("auto", edited, tokenizer_sha256="another")
    assert len(calls) == 3


def test_a_failed_proof_is_cached_too(tiny, monkeypatch):
    calls = counting(monkeypatch)
    target = next(p for p in proof.probe_texts(tiny) if p.startswith("don't"))
    calls.clear()
    planted(monkeypatch, target)
    first = resolve_engine("auto", tiny)
    second = resolve_engine("auto", tiny)
    assert first.name == second.name == "hf" and first.reason == second.reason
    assert len(calls) == 1


def test_a_broken_cache_entry_is_probed_again(tiny, cache_dir, monkeypatch):
    calls = counting(monkeypatch)
    resolve_engine("auto", tiny)
    (entry,) = (cache_dir / "engines").glob("*.json")
    entry.write_text("{not json")
    assert resolve_engine("auto", tiny).name == "fastokens" and len(calls) == 2
    assert json.loads(entry.read_text())["equal"] is True


def test_cache_off_reads_and_writes_nothing(tiny, cache_dir):
    assert resolve_engine("auto", tiny, cache=False).name == "fastokens"
    assert not (cache_dir / "engines").exists()


def test_the_probe_set_covers_the_tokenizer(tiny):
    probes = proof.probe_texts(tiny)
    for token in SPECIALS:
        assert token in probes and " " + token + " " in probes and "a" + token in probes
    assert " " * 17 in probes and "\n" * 17 in probes and "\t" * 5 in probes
    assert any("\u200d" in p for p in probes) and "\x00" in probes
    assert len(probes) == len(set(probes))
    assert engines.ENGINES == ("auto", "hf", "fastokens")


def test_a_cache_that_cannot_be_written_costs_a_probe_only(tiny, tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("PACKER_CACHE_DIR", str(blocker))
    calls = counting(monkeypatch)
    assert resolve_engine("auto", tiny).name == "fastokens"
    assert resolve_engine("auto", tiny).name == "fastokens" and len(calls) == 2
    assert blocker.read_text() == "" and list(tmp_path.iterdir()) == [blocker]


def test_a_refusal_to_load_is_cached(monkeypatch):
    from tokenizers import Tokenizer, models

    unigram = Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0), ("b", -2.0)], 0))
    built = []
    from_json = FastokensEngine.from_json.__func__

    def counted(cls, text):
        built.append(1)
        return from_json(cls, text)

    monkeypatch.setattr(FastokensEngine, "from_json", classmethod(counted))
    first, second = resolve_engine("auto", unigram), resolve_engine("auto", unigram)
    assert first.reason == second.reason and "Unigram" in second.reason and len(built) == 1
    with pytest.raises(EngineError, match="unsupported model type: Unigram"):
        resolve_engine("fastokens", unigram)
    assert len(built) == 1
    assert resolve_engine("auto", unigram, cache=False).reason == first.reason
    assert len(built) == 2


@pytest.mark.slow
def test_same_ids_on_llama3_and_the_bench_runs(tmp_path):
    """Meta's Llama 3 tokenizer.model (the llama-models 0.3.0 wheel), converted as
    scripts/bench_engines.py does, BOS post-processor included; then the bench itself, small."""
    import subprocess

    from engines_util import ROOT

    if not (ROOT / ".whl" / "llama_models-0.3.0-py3-none-any.whl").is_file():
        pytest.skip("llama_models-0.3.0 wheel not downloaded")
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_engines import LLAMA_SPECIALS, llama3_backend

    backend = llama3_backend()
    specials = [LLAMA_SPECIALS[0], "<|start_header_id|>", "<|eot_id|>"]
    texts = generated_texts(300, seed=6, specials=specials)
    assert_same_ids(backend, texts)
    assert backend.encode("hi").ids[0] == backend.token_to_id(LLAMA_SPECIALS[0])  # BOS added
    assert resolve_engine("fastokens", backend, extra_texts=texts).name == "fastokens"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_engines.py"), "--lines", "60"]
        + ["--runs", "1", "--vocabularies", "bench", "anthropic"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| bench (" in done.stdout and "| anthropic (65,000) |" in done.stdout


def test_fastokens_is_built_once_per_tokenizer_per_process(tiny, monkeypatch):
    """A second run on the same tokenizer in one process reuses the built encoder; another
    tokenizer is built anew, and an edited one too (the key is the backend's whole JSON)."""
    import fastokens

    builds = []
    real = fastokens.Tokenizer.from_json_str
    monkeypatch.setattr(
        fastokens.Tokenizer, "from_json_str", lambda text: builds.append(1) or real(text)
    )
    engines._built.cache_clear()
    first = resolve_engine("fastokens", tiny, cache=False).engine
    second = resolve_engine("fastokens", tiny, cache=False).engine
    assert len(builds) == 1 and first.native is second.native
    assert first.encode_batch(["ab a"], add_special_tokens=False) == HFEngine(tiny).encode_batch(
        ["ab a"], add_special_tokens=False
    )
    edited = with_bos(tiny)
    resolve_engine("fastokens", edited, cache=False)
    assert len(builds) == 2
    engines._built.cache_clear()

"""Real chat templates and real vocabularies, offline, for the family tests (not a test file).

`make setup` puts them in place (nothing of them is in the repository):

- `vendor/llama.cpp/models/templates/*.jinja`: the chat templates that llama.cpp ships, out of
  the llama-cpp-python 0.3.36 sdist on PyPI;
- `vendor/llama.cpp/models/ggml-vocab-*.gguf`: its vocab-only GGUF files, each with
  `.inp`/`.out` files of texts and the ids llama.cpp expects for them;
- `vendor/llama-models/llama3/tokenizer.model`: Meta's Llama 3 vocabulary (tiktoken format),
  out of the llama-models 0.3.0 wheel.

Each `Vocab` is turned into a 🤗 fast tokenizer and saved with `save_pretrained` under
`vendor/tokenizers/` (gitignored), so that packer's `--tokenizer DIR` loads it: the converted
source once (`source-NAME-KEY/`: up to ~90 s for the 262k-token Gemma-4 GGUF on a loaded machine),
then each vocabulary built on it (`NAME-KEY/`: tokens added, bos/eos set), KEY a digest of the
source file, the table's entry and the transformers/tokenizers versions. So a conversion runs
once per machine, not once per test session.

How each vocabulary is obtained, and why (the conversion gaps are transformers' GGUF reader's):

- GGUF files through `AutoTokenizer.from_pretrained(dir, gguf_file=...)`, or
  `PreTrainedTokenizerFast(gguf_file=...)` where AutoTokenizer refuses the architecture
  (gemma-4, command-r). qwen35's GGUF is the qwen2 vocabulary under another pre-tokenizer name
  (transformers reads it as qwen2); its own `.inp`/`.out` check it.
- Llama 3 from Meta's `tokenizer.model` through transformers' `TikTokenConverter` with Meta's
  256 special tokens (`llama_models/llama3/tokenizer.py`): the Llama 3 GGUF, converted, adds a
  spurious `<|endoftext|>` and lacks `<|eom_id|>` and `<|python_tag|>`, which the Llama 3.1
  template writes. Its ids are checked against the llama-bpe GGUF's `.inp`/`.out`.
- Where no vocabulary of the model itself is available, the template's control tokens are added
  to the nearest one (`Vocab.special`: control tokens, `Vocab.plain`: added tokens that are not
  special, as the model's own tokenizer marks them); the table `VOCABS` says which, per family.
  A token that the template writes but the vocabulary lacks would otherwise be split into text
  pieces, and the template's turn markers would not be control tokens.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "vendor" / "llama.cpp" / "models"
TEMPLATES = MODELS / "templates"
LLAMA3_MODEL = ROOT / "vendor" / "llama-models" / "llama3" / "tokenizer.model"
CACHE = ROOT / "vendor" / "tokenizers"
SETUP = "make setup fetches it (the llama-cpp-python 0.3.36 sdist and llama-models 0.3.0 wheel)"

# Meta's Llama 3 special tokens, in id order from 128000 (llama_models/llama3/tokenizer.py)
LLAMA3_SPECIALS = [
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
LLAMA3_SPECIALS += [
    f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(LLAMA3_SPECIALS))
]
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHATML = ("<|im_start|>", "<|im_end|>")
TOOL_TAGS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
THINK_TAGS = ("<think>", "</think>")
DEEPSEEK = (
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
    "<｜tool▁sep｜>",
)
HARMONY = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>")
HARMONY += ("<|call|>",)
MISTRAL = (
    "[INST]",
    "[/INST]",
    "[TOOL_CALLS]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[ARGS]",
    "[CALL_ID]",
    "[TOOL_CONTENT]",
    "[IMG]",
)
GRANITE = (
    "<|start_of_role|>",
    "<|end_of_role|>",
    "<|end_of_text|>",
    "<|tool_call|>",
    "<|start_of_cite|>",
    "<|end_of_cite|>",
)


@dataclass(frozen=True)
class Vocab:
    """A vocabulary: `source` is a GGUF file name in MODELS or "llama3" (Meta's
    tokenizer.model); `special`/`plain` are tokens added to it; `bos`/`eos` override the
    source's; `check` names the GGUF whose `.inp`/`.out` ids the base vocabulary must give."""

    name: str
    source: str
    special: tuple[str, ...] = ()
    plain: tuple[str, ...] = ()
    bos: str | None = None
    eos: str | None = None
    check: str | None = None
    fix: str | None = None  # a repair of transformers' GGUF conversion: see FIXES

    @property
    def source_path(self) -> Path:
        return LLAMA3_MODEL if self.source == "llama3" else MODELS / self.source

    @property
    def check_path(self) -> Path:
        return MODELS / (self.check or self.source)


LLAMA3 = dict(source="llama3", check="ggml-vocab-llama-bpe.gguf", bos="<|begin_of_text|>")
QWEN2 = dict(source="ggml-vocab-qwen2.gguf", plain=TOOL_TAGS + THINK_TAGS)

VOCABS: dict[str, Vocab] = {
    v.name: v
    for v in [
        # Meta's Llama 3 vocabulary as it is: Llama-3.1/3.2/3.3
        Vocab("llama3", **LLAMA3, eos="<|eot_id|>"),
        # Llama 3 with ChatML's two control tokens (Hermes-2-Pro/3, SmolLM3 are Llama 3 vocabularies
        # whose reserved tokens were renamed so); tool and think tags as plain added tokens
        Vocab(
            "llama3-chatml",
            **LLAMA3,
            special=CHATML,
            plain=TOOL_TAGS + THINK_TAGS,
            eos="<|im_end|>",
        ),
        # the R1 distill of Llama 3: DeepSeek's control tokens on Llama 3
        Vocab(
            "llama3-deepseek",
            source="llama3",
            check="ggml-vocab-llama-bpe.gguf",
            special=DEEPSEEK,
            plain=THINK_TAGS,
            bos="<｜begin▁of▁sentence｜>",
            eos="<｜end▁of▁sentence｜>",
        ),
        # gpt-oss's o200k_harmony vocabulary is not available: Harmony's control tokens on Llama 3
        Vocab("llama3-harmony", **LLAMA3, special=HARMONY, eos="<|return|>"),
        Vocab("qwen2", **QWEN2, eos="<|im_end|>"),
        Vocab(
            "qwen35",
            source="ggml-vocab-qwen35.gguf",
            plain=TOOL_TAGS + THINK_TAGS,
            eos="<|im_end|>",
        ),
        # the R1 distill of Qwen 2.5: DeepSeek's control tokens on Qwen 2
        Vocab(
            "qwen2-deepseek",
            source="ggml-vocab-qwen2.gguf",
            special=DEEPSEEK,
            plain=THINK_TAGS,
            bos="<｜begin▁of▁sentence｜>",
            eos="<｜end▁of▁sentence｜>",
        ),
        # DeepSeek-V3's 128k vocabulary is not available: DeepSeek LLM's, with V3's control tokens
        Vocab(
            "deepseek-v3",
            source="ggml-vocab-deepseek-llm.gguf",
            special=DEEPSEEK,
            plain=THINK_TAGS,
            bos="<｜begin▁of▁sentence｜>",
            eos="<｜end▁of▁sentence｜>",
        ),
        Vocab("gemma4", source="ggml-vocab-gemma-4.gguf", eos="<turn|>"),
        # Gemma 2's vocabulary is not available: Gemma 4's (the same SentencePiece lineage), with
        # Gemma 2's turn markers
        Vocab(
            "gemma4-gemma2",
            source="ggml-vocab-gemma-4.gguf",
            special=("<start_of_turn>", "<end_of_turn>"),
            eos="<end_of_turn>",
        ),
        Vocab("phi3", source="ggml-vocab-phi-3.gguf"),
        # Mistral's Tekken vocabulary is not available: Llama 2's SentencePiece one (Mistral v0.3's
        # lineage) with Mistral's control tokens
        Vocab(
            "llama-spm-mistral",
            source="ggml-vocab-llama-spm.gguf",
            special=MISTRAL,
            fix="spm-prepend",
        ),
        # Granite 3's vocabulary is StarCoder's with Granite's role tokens
        Vocab(
            "starcoder-granite",
            source="ggml-vocab-starcoder.gguf",
            special=GRANITE,
            eos="<|end_of_text|>",
            fix="digits",
        ),
        Vocab("command-r", source="ggml-vocab-command-r.gguf"),
    ]
}


@dataclass(frozen=True)
class Family:
    """A model family: its template file (in TEMPLATES) and the `VOCABS` entry that serves it."""

    name: str
    template: str
    vocab: str
    notes: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def template_path(self) -> Path:
        return TEMPLATES / self.template


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family("llama-3.1", "meta-llama-Llama-3.1-8B-Instruct.jinja", "llama3"),
        Family("llama-3.2", "meta-llama-Llama-3.2-3B-Instruct.jinja", "llama3"),
        Family("llama-3.3", "meta-llama-Llama-3.3-70B-Instruct.jinja", "llama3"),
        Family("qwen2.5", "Qwen-Qwen2.5-7B-Instruct.jinja", "qwen2"),
        Family("qwen3", "Qwen-Qwen3-0.6B.jinja", "qwen2"),
        Family("qwen3.5", "Qwen3.5-4B.jinja", "qwen35"),
        Family("qwq", "Qwen-QwQ-32B.jinja", "qwen2"),
        Family(
            "r1-distill-qwen", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "qwen2-deepseek"
        ),
        Family(
            "r1-distill-llama", "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", "llama3-deepseek"
        ),
        Family("deepseek-v3.1", "deepseek-ai-DeepSeek-V3.1.jinja", "deepseek-v3"),
        Family("gpt-oss", "openai-gpt-oss-120b.jinja", "llama3-harmony"),
        Family("gemma-2", "google-gemma-2-2b-it.jinja", "gemma4-gemma2"),
        Family("gemma-4", "google-gemma-4-31B-it.jinja", "gemma4"),
        Family("phi-3.5", "microsoft-Phi-3.5-mini-instruct.jinja", "phi3"),
        Family("mistral-nemo", "mistralai-Mistral-Nemo-Instruct-2407.jinja", "llama-spm-mistral"),
        Family(
            "mistral-small-3.2", "Mistral-Small-3.2-24B-Instruct-2506.jinja", "llama-spm-mistral"
        ),
        Family("granite-3.3", "ibm-granite-granite-3.3-2B-Instruct.jinja", "starcoder-granite"),
        Family("smollm3", "HuggingFaceTB-SmolLM3-3B.jinja", "llama3-chatml"),
        Family(
            "hermes-2-pro", "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", "llama3-chatml"
        ),
        Family("hermes-3", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "llama3-chatml"),
        Family("command-r-plus", "CohereForAI-c4ai-command-r-plus-tool_use.jinja", "command-r"),
    ]
}


def missing(vocab: Vocab | None = None, family: Family | None = None) -> str | None:
    """Why the files are absent (a skip reason), or None."""
    paths = []
    if family is not None:
        paths.append(family.template_path)
        vocab = vocab or VOCABS[family.vocab]
    if vocab is not None:
        paths += [vocab.source_path, vocab.check_path]
    for path in paths:
        if not path.is_file():
            return f"{path.relative_to(ROOT)} is absent: {SETUP}"
    return None


def expected_ids(gguf: Path) -> list[tuple[str, list[int]]]:
    """(text, ids) pairs of llama.cpp's tokenizer test for a GGUF vocabulary: the `.inp` file
    holds the texts, each followed by a separator line, the `.out` file one line of ids each."""
    separator = "\n__ggml_vocab_test__\n"
    text = Path(f"{gguf}.inp").read_text(encoding="utf-8")
    texts = text.split(separator)
    if text.endswith(separator):
        texts.pop()
    lines = Path(f"{gguf}.out").read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    assert len(texts) == len(lines), f"{gguf.name}: {len(texts)} texts, {len(lines)} id lines"
    return [(t, [int(i) for i in line.split()]) for t, line in zip(texts, lines)]


def tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """A tiktoken BPE file (one `base64(token) rank` a line), read without tiktoken."""
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def build_llama3(path: Path):
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class Converter(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url):
            return tiktoken_ranks(Path(tiktoken_url))

    backend = Converter(
        vocab_file=str(path), pattern=LLAMA3_PATTERN, extra_special_tokens=LLAMA3_SPECIALS
    ).converted()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>"
    )


def build_gguf(path: Path):
    from unittest import mock

    import gguf
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    with mock.patch.object(gguf, "GGUFReader", plain_reader()):
        try:
            return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        except Exception:  # an architecture AutoTokenizer's GGUF reader refuses (gemma4, command-r)
            return PreTrainedTokenizerFast.from_pretrained(str(path.parent), gguf_file=path.name)


def plain_reader():
    """gguf's `GGUFReader`, reading its file through a plain ndarray view of the memmap: the
    same fields, but each of the million slices a vocabulary's strings take skips numpy's
    memmap subclass hooks (two thirds of the 30 s gemma-4's GGUF took to read)."""
    import numpy as np
    from gguf import GGUFReader

    class PlainReader(GGUFReader):
        @property
        def data(self):
            return self._plain

        @data.setter
        def data(self, value):
            self._plain = value.view(np.ndarray)

    return PlainReader


def repair(backend, fix: str | None) -> None:
    """Repairs of transformers' GGUF conversion, to the layout of the model's own tokenizer.json
    (each proven by the GGUF's `.inp`/`.out` ids, tests/test_real_vocabularies.py):

    - "spm-prepend": Llama 2's SentencePiece vocabulary comes out with a Metaspace pre-tokenizer
      that adds no `▁` before a text that starts with a space (" Hello" gives `▁Hello`);
      llama.cpp, and Llama 2's and Mistral's own tokenizer.json, prepend `▁` in the normalizer
      (`▁▁Hello`), as the Phi-3 GGUF converts;
    - "digits": StarCoder's vocabulary comes out with GPT-2's pre-tokenizer, which joins a space
      to a number (" ½"); StarCoder's own splits every digit alone first."""
    from tokenizers import normalizers, pre_tokenizers

    if fix == "spm-prepend":
        backend.normalizer = normalizers.Sequence(
            [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
        )
        backend.pre_tokenizer = None
    elif fix == "digits":
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    elif fix is not None:
        raise ValueError(f"unknown fix {fix!r}")


def convert(vocab: Vocab):
    """The source vocabulary as a fast tokenizer, repaired, nothing added (the slow step)."""
    if vocab.source == "llama3":
        base = build_llama3(vocab.source_path)
    else:
        base = build_gguf(vocab.source_path)
    repair(base.backend_tokenizer, vocab.fix)
    return base


def build(vocab: Vocab):
    """The vocabulary as a fast tokenizer, tokens added and bos/eos set, from the converted
    source (`converted_dir`: several vocabularies share one source)."""
    from transformers import AddedToken, PreTrainedTokenizerFast

    base = PreTrainedTokenizerFast.from_pretrained(str(converted_dir(vocab)), local_files_only=True)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=base.backend_tokenizer,
        bos_token=vocab.bos or base.bos_token,
        eos_token=vocab.eos or base.eos_token,
        unk_token=base.unk_token,
        pad_token=base.pad_token,
    )
    have = tokenizer.get_vocab()
    new_special = [t for t in vocab.special if t not in have]
    if new_special:
        tokens = [AddedToken(t, special=True, normalized=False) for t in new_special]
        tokenizer.add_special_tokens({"additional_special_tokens": tokens})
    # a control token the source has as a plain token is made special
    for t in vocab.special:
        if t in have:
            tokenizer.add_tokens(
                [AddedToken(t, special=True, normalized=False)], special_tokens=True
            )
    plain = [AddedToken(t, special=False, normalized=False) for t in vocab.plain if t not in have]
    tokenizer.add_tokens(plain)
    return tokenizer


def digest(*parts) -> str:
    import tokenizers
    import transformers

    spec = [*parts, transformers.__version__, tokenizers.__version__, 1]
    return hashlib.sha256(json.dumps(spec).encode()).hexdigest()[:16]


def saved(name: str, make) -> Path:
    """CACHE/NAME, written by `make().save_pretrained` where absent, under a temporary name
    renamed into place (parallel test processes never read half of one). A lock per name makes
    a second test process wait for the first one's copy instead of converting the same
    vocabulary again (gemma-4's takes half a minute)."""
    target = CACHE / name
    if (target / "tokenizer.json").is_file():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "tokenizer.json").is_file():
            return target
        scratch = CACHE / f".{name}.{uuid.uuid4().hex}"
        make().save_pretrained(str(scratch))
        try:
            os.rename(scratch, target)
        except OSError:  # another process got there first: its copy is the same
            shutil.rmtree(scratch, ignore_errors=True)
    return target


def source_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def converted_dir(vocab: Vocab) -> Path:
    key = digest(vocab.source, source_digest(vocab.source_path), vocab.fix)
    stem = vocab.source.removeprefix("ggml-vocab-").removesuffix(".gguf")
    return saved(f"source-{stem}-{key}", lambda: convert(vocab))


def tokenizer_dir(vocab: Vocab | str) -> Path:
    """The directory `save_pretrained` wrote for this vocabulary (built on first use)."""
    vocab = VOCABS[vocab] if isinstance(vocab, str) else vocab
    key = digest(
        vocab.name,
        source_digest(vocab.source_path),
        vocab.special,
        vocab.plain,
        vocab.bos,
        vocab.eos,
        vocab.fix,
    )
    return saved(f"{vocab.name}-{key}", lambda: build(vocab))


def load(vocab: Vocab | str):
    """The saved tokenizer, loaded as packer loads a `--tokenizer DIR` of this layout."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir(vocab)), local_files_only=True)


def special_tokens(tokenizer) -> set[str]:
    """The control tokens of a vocabulary: its added tokens marked special, and the named ones."""
    added = {t.content for t in tokenizer.added_tokens_decoder.values() if t.special}
    return added | set(tokenizer.all_special_tokens)

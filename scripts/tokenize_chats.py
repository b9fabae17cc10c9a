"""Tokenize chat or text JSONL into packer's input: `input_ids`, and `labels` that are -100
everywhere except on the assistant's replies.

Each input line is one of
    {"messages": [{"role": "user", "content": ...}, {"role": "assistant", ...}, ...]}
    {"text": ...}
    {"prompt": ..., "completion": ...}
A chat goes through the tokenizer's chat template; only the assistant turns (with their
end-of-turn token) carry labels. A text is trained on whole and gets EOS appended; a prompt is
masked and its completion, with EOS, trained on. Labels are aligned with `input_ids`, unshifted:
the model shifts them, and packer masks the first label of every sample when it packs.

    python scripts/tokenize_chats.py chats.jsonl --tokenizer ./tokenizer -o train.jsonl

Lines are read, tokenized and written one at a time, into a temporary file renamed at the end:
a run that fails leaves no output. Guide: docs/tokenize.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

IGNORE_INDEX = -100
EXIT_DATA = 1  # a bad input line, as `packer pack` exits on bad data
EXIT_USAGE = 2  # bad options: the tokenizer, the template, the output path
GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")  # what transformers looks for
OUTPUT_SUFFIXES = (".jsonl", ".jsonl.gz", ".parquet")
KINDS = ("chats", "texts", "prompt/completion pairs")
PARQUET_ROWS = 1024  # rows per Parquet row group: bounded memory, whatever the input size


class Failure(Exception):
    """One line for the user, and the exit code."""

    def __init__(self, message: str, code: int = EXIT_DATA):
        super().__init__(message)
        self.code = code


# --------------------------------------------------------------------------------------------
# One sample


def chat_sample(tokenizer, messages: list, method: str) -> tuple[list[int], list[int]]:
    """Token ids and labels of one chat; labels keep the assistant turns only."""
    if method == "generation":
        encoded = tokenizer.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        ids, mask = list(encoded["input_ids"]), list(encoded["assistant_masks"])
    else:
        ids, mask = prefix_mask(tokenizer, messages)
    if not any(mask):  # the chat has an assistant message: a template that loses it is wrong
        where = "its {% generation %} blocks" if method == "generation" else "it"
        raise Failure(f"the chat template renders no assistant token: {where} must hold each reply")
    return ids, [t if m else IGNORE_INDEX for t, m in zip(ids, mask)]


def prefix_mask(tokenizer, messages: list) -> tuple[list[int], list[int]]:
    """The fallback for templates without {% generation %} markers: an assistant turn is the
    tokens that rendering the chat up to and including it adds to rendering the chat before it
    with the generation prompt, up to its last special token (the end-of-turn token) when only
    whitespace follows (ChatML's newline after <|im_end|> is never generated). Sound only if
    every such prefix is a prefix of the whole chat, which is checked: a template that renders
    earlier turns differently (dropping reasoning, say) fails here instead of mislabeling."""

    def encode(upto: list, prompt: bool) -> list[int]:
        kwargs = {"tokenize": True, "return_dict": True, "add_generation_prompt": prompt}
        return list(tokenizer.apply_chat_template(upto, **kwargs)["input_ids"])

    ids, special = encode(messages, False), special_ids(tokenizer)
    mask = [0] * len(ids)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start, end = encode(messages[:i], True), encode(messages[: i + 1], False)
        if ids[: len(start)] != start or ids[: len(end)] != end:
            raise Failure(
                f"the chat template does not render the chat before messages[{i}] as a prefix "
                "of the whole chat, so its reply cannot be told apart; use a template with "
                "{% generation %} markers (--chat-template)"
            )
        stop = reply_end(tokenizer, ids, len(start), len(end), special)
        mask[len(start) : stop] = [1] * (stop - len(start))
    return ids, mask


def special_ids(tokenizer) -> set[int]:
    added = tokenizer.added_tokens_decoder.items()
    return set(tokenizer.all_special_ids) | {i for i, token in added if token.special}


def reply_end(tokenizer, ids: list[int], start: int, end: int, special: set[int]) -> int:
    """Where the reply in ids[start:end] ends: after its last special token if only
    whitespace follows that token, else at `end`."""
    last = next((i for i in range(end - 1, start - 1, -1) if ids[i] in special), None)
    if last is not None and not tokenizer.decode(ids[last + 1 : end]).strip():
        return last + 1
    return end


def text_ids(tokenizer, text: str, special: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def with_eos(tokenizer, ids: list[int]) -> list[int]:
    """EOS ends every text, so the model learns to stop; not twice if the tokenizer adds it."""
    return ids if ids and ids[-1] == tokenizer.eos_token_id else [*ids, tokenizer.eos_token_id]


def sample(tokenizer, record: object, method: str) -> tuple[str, list[int], list[int]]:
    """(kind, input_ids, labels) of one parsed input line."""
    if not isinstance(record, dict):
        raise Failure(f"expected a JSON object, got {type(record).__name__}")
    if "messages" in record:
        messages = record["messages"]
        if not isinstance(messages, list) or not messages:
            raise Failure("'messages' must be a non-empty list of {role, content} objects")
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise Failure(f"messages[{i}] has no 'role' string")
        if not any(m["role"] == "assistant" for m in messages):
            raise Failure(
                "no message with role 'assistant': nothing to train on (roles are system, "
                "user, assistant; ShareGPT's from/value must be converted first)"
            )
        if method == "none":
            raise Failure(
                "the tokenizer has no chat template: pass --chat-template FILE", EXIT_USAGE
            )
        return ("chats", *chat_sample(tokenizer, messages, method))
    if "text" in record:
        if not isinstance(record["text"], str) or not record["text"]:
            raise Failure("'text' must be a non-empty string")
        ids = with_eos(tokenizer, text_ids(tokenizer, record["text"], True))
        return "texts", ids, list(ids)
    if "prompt" in record or "completion" in record:
        prompt, completion = record.get("prompt"), record.get("completion")
        if not isinstance(prompt, str) or not isinstance(completion, str) or not completion:
            raise Failure("'prompt' and 'completion' must be strings, the completion non-empty")
        # tokenized apart, as at inference: the prompt alone, then the reply the model writes
        head = text_ids(tokenizer, prompt, True)
        tail = with_eos(tokenizer, text_ids(tokenizer, completion, False))
        return "prompt/completion pairs", head + tail, [IGNORE_INDEX] * len(head) + tail
    raise Failure("no 'messages', 'text' or 'prompt'/'completion' field")


# --------------------------------------------------------------------------------------------
# Files


def read_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, line) of every non-blank line, streamed."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            for number, line in enumerate(fh, 1):
                if line.strip():
                    yield number, line
    except (OSError, EOFError) as e:  # missing, unreadable, not gzip, cut short
        raise Failure(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None


class Sink:
    """Writes samples to a temporary file beside `path`; `commit` renames it into place."""

    def __init__(self, path: Path):
        self.path = path
        self.tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        self.parquet = path.name.endswith(".parquet")
        self.rows: list[tuple[list[int], list[int]]] = []
        if self.parquet:
            import pyarrow as pa
            import pyarrow.parquet as pq

            self.schema = pa.schema(
                [("input_ids", pa.list_(pa.int32())), ("labels", pa.list_(pa.int32()))]
            )
            self.writer = pq.ParquetWriter(self.tmp, self.schema)
        elif path.name.endswith(".gz"):
            # mtime=0 and no name in the header: the same input gives the same bytes
            self.raw = open(self.tmp, "wb")  # noqa: SIM115 (closed in close())
            self.fh = gzip.GzipFile(filename="", fileobj=self.raw, mode="wb", mtime=0)
        else:
            self.raw = None
            self.fh = open(self.tmp, "wb")  # noqa: SIM115 (closed in close())

    def write(self, ids: list[int], labels: list[int]) -> None:
        if not self.parquet:
            line = json.dumps({"input_ids": ids, "labels": labels}, separators=(",", ":"))
            self.fh.write(line.encode() + b"\n")
            return
        self.rows.append((ids, labels))
        if len(self.rows) >= PARQUET_ROWS:
            self.flush()

    def flush(self) -> None:
        import pyarrow as pa

        if self.rows:
            ids, labels = zip(*self.rows)
            table = pa.table(
                [pa.array(ids, self.schema[0].type), pa.array(labels, self.schema[1].type)],
                schema=self.schema,
            )
            self.writer.write_table(table)
            self.rows = []

    def close(self) -> None:
        if self.parquet:
            self.flush()
            self.writer.close()
        else:
            self.fh.close()
            if self.raw is not None:
                self.raw.close()

    def commit(self) -> None:
        self.close()
        os.replace(self.tmp, self.path)

    def discard(self) -> None:
        try:
            self.close()
        finally:
            self.tmp.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------
# Command line


def unreachable_hub(timeout: float = 5.0) -> str | None:
    """The hub's endpoint when a connection to it fails within `timeout` seconds, else None.

    Without a network the hub client retries each file it asks for (72 s for a tokenizer
    against a refused port here); one connection attempt says the same at once. Skipped when
    the client is offline already (HF_HUB_OFFLINE) or reaches the hub through a proxy."""
    import socket
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    proxies = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
    if constants.HF_HUB_OFFLINE or any(os.environ.get(v) for v in proxies):
        return None
    url = urlsplit(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout):
            return None
    except OSError:
        return constants.ENDPOINT


def load_tokenizer(name: str, template_file: Path | None):
    if not Path(name).exists() and name.startswith(("/", "./", "../", "~")):
        raise Failure(f"--tokenizer {name}: no such directory", EXIT_USAGE)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from huggingface_hub.utils import logging as hub_logging
    from transformers import AutoTokenizer
    from transformers.utils import logging

    logging.set_verbosity_error()  # no warnings between our one-line messages
    hub_logging.set_verbosity_error()  # nor the hub's retries
    endpoint = None if Path(name).exists() else unreachable_hub()
    try:
        # an unreachable hub: the local cache only, instead of a minute of the client's retries
        tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=endpoint is not None)
    except Exception as e:  # OSError, ValueError, HTTP errors: all mean "cannot load it"
        if endpoint is not None:
            raise Failure(
                f"--tokenizer {name}: cannot reach the Hugging Face hub ({endpoint}) and it is "
                "not in the local cache; pass a local tokenizer directory, or load it once where "
                "the hub is reachable",
                EXIT_DATA,
            ) from None
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise Failure(f"--tokenizer {name}: cannot load it: {first}", EXIT_USAGE) from None
    if not tokenizer.is_fast:
        raise Failure(f"--tokenizer {name}: not a fast tokenizer (no tokenizer.json)", EXIT_USAGE)
    if tokenizer.eos_token_id is None:
        raise Failure(f"--tokenizer {name}: has no eos_token to end samples with", EXIT_USAGE)
    if template_file is not None:
        try:
            tokenizer.chat_template = template_file.read_text(encoding="utf-8")
        except OSError as e:
            raise Failure(
                f"--chat-template {template_file}: {e.strerror or e}", EXIT_USAGE
            ) from None
    return tokenizer


def mask_method(tokenizer, asked: str) -> str:
    """generation, prefix, or none (no template: chat lines are refused when met)."""
    template = tokenizer.chat_template
    if not isinstance(template, str):  # None, or a dict of named templates
        if template:
            raise Failure(
                "the tokenizer has several chat templates: pass one with --chat-template",
                EXIT_USAGE,
            )
        return "none"
    marked = GENERATION.search(template) is not None
    if asked == "generation" and not marked:
        raise Failure(
            "--assistant-mask generation: the chat template has no {% generation %} markers",
            EXIT_USAGE,
        )
    if asked == "prefix" or (asked == "auto" and not marked):
        if "add_generation_prompt" not in template:
            # then the assistant header would fall inside the reply and be trained on
            raise Failure(
                "--assistant-mask prefix: the chat template ignores add_generation_prompt",
                EXIT_USAGE,
            )
        return "prefix"
    return "generation"


def output_path(path: Path, overwrite: bool) -> Path:
    if not path.name.endswith(OUTPUT_SUFFIXES):
        raise Failure(f"--output {path}: name must end in {', '.join(OUTPUT_SUFFIXES)}", EXIT_USAGE)
    if path.exists() and not overwrite:
        raise Failure(f"--output {path}: exists; pass --overwrite to replace it", EXIT_USAGE)
    if path.parent.exists() and not path.parent.is_dir():
        raise Failure(f"--output {path}: {path.parent} is not a directory", EXIT_USAGE)
    path.parent.mkdir(parents=True, exist_ok=True)  # as packer pack -o makes its parents
    return path


def tokenize_files(inputs: list[Path], sink: Sink, tokenizer, method: str) -> dict[str, int]:
    counts = dict.fromkeys(KINDS, 0) | {"tokens": 0, "loss tokens": 0}
    for path in inputs:
        for number, line in read_lines(path):
            try:
                try:
                    record = json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError) as e:
                    raise Failure(f"not JSON ({e})") from None
                kind, ids, labels = sample(tokenizer, record, method)
            except Failure as e:
                raise Failure(f"{path}:{number}: {e}", e.code) from None
            except Exception as e:  # the template's raise_exception, a message it cannot render
                raise Failure(f"{path}:{number}: {type(e).__name__}: {e}") from e
            sink.write(ids, labels)
            counts[kind] += 1
            counts["tokens"] += len(ids)
            counts["loss tokens"] += sum(label != IGNORE_INDEX for label in labels)
    return counts


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        """One line, as every other error, instead of the usage and the message."""
        print(f"error: {message}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = Parser(
        description="Tokenize chat or text JSONL into packer's input (input_ids, labels).",
        epilog="Guide: docs/tokenize.md",
    )
    parser.add_argument(
        "inputs", nargs="+", type=Path, metavar="INPUT", help="JSONL (.jsonl, .jsonl.gz)"
    )
    parser.add_argument(
        "-o", "--output", type=Path, required=True, help="output: .jsonl, .jsonl.gz or .parquet"
    )
    parser.add_argument(
        "--tokenizer",
        required=True,
        metavar="NAME_OR_DIR",
        help="hub name or local directory of a Hugging Face tokenizer",
    )
    parser.add_argument(
        "--chat-template",
        type=Path,
        metavar="FILE",
        help="Jinja chat template to use instead of the tokenizer's",
    )
    parser.add_argument(
        "--assistant-mask",
        choices=["auto", "generation", "prefix"],
        default="auto",
        help="how assistant turns are found: the template's {%% generation %%} markers, or "
        "tokenizing prefix by prefix; auto: markers when the template has them (default)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output")
    parser.add_argument("--debug", action="store_true", help="show the full traceback on errors")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sink = None
    try:
        out = output_path(args.output, args.overwrite)
        tokenizer = load_tokenizer(args.tokenizer, args.chat_template)
        method = mask_method(tokenizer, args.assistant_mask)
        sink = Sink(out)
        counts = tokenize_files(args.inputs, sink, tokenizer, method)
        sink.commit()
    except OSError as e:  # the output cannot be written: full disk, permissions
        if sink is not None:
            sink.discard()
        print(f"error: --output {args.output}: cannot write: {e.strerror or e}", file=sys.stderr)
        return EXIT_DATA
    except (Failure, KeyboardInterrupt) as e:
        if sink is not None:
            sink.discard()
        if isinstance(e, KeyboardInterrupt):
            return 130
        if args.debug:
            traceback.print_exception(e.__cause__ or e)
        print(f"error: {e}", file=sys.stderr)
        return e.code
    kinds = ", ".join(f"{k} {counts[k]:,}" for k in KINDS if counts[k])
    print(
        f"{out}: {kinds or 'no samples'}; {counts['tokens']:,} tokens, "
        f"{counts['loss tokens']:,} with labels",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

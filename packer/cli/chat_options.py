"""The tokenizer options of `packer tokenize`, `pack` and `verify` (--train-reasoning,
--train-tool-calls, --turns, --template-date beside --chat-template and --train-on): their flags and help, the
declarations pack and verify share (`raw_option`), and the cache key that holds them."""

from __future__ import annotations

TRAIN_ON = ("assistant", "last", "all")
TURNS = ("all", "one-per-sample")
MASK_FLAGS = {  # Encoder keyword -> the flag that sets it
    "train_reasoning": "--train-reasoning",
    "train_tool_calls": "--train-tool-calls",
    "turns": "--turns",
    "template_date": "--template-date",
}
TEMPLATE_HELP = (
    "A Jinja chat template file that replaces the tokenizer's. [default: the tokenizer's]"
)
TRAIN_ON_HELP = (
    "Which chat tokens carry labels: every assistant turn, the last assistant turn, or all "
    "tokens; each trained turn includes its end-of-turn token. [default: assistant]"
)
TRAIN_REASONING_HELP = (
    "Train each reply's reasoning where the template renders it (Qwen3's think block, "
    "gpt-oss's analysis channel); --no-train-reasoning starts the reply after it. "
    "[default: --train-reasoning]"
)
TRAIN_TOOL_CALLS_HELP = (
    "Train each reply's tool calls; --no-train-tool-calls ends the reply before them (a reply "
    "of tool calls only is not trained). [default: --train-tool-calls]"
)
TURNS_HELP = (
    "all: one sample per chat; one-per-sample: one sample per trained assistant turn, the chat "
    "up to it rendered as its last turn (a reasoning template keeps that turn's reasoning). "
    "[default: all]"
)

TEMPLATE_DATE_HELP = (
    "The date a template that writes today's date (gpt-oss, Llama-3.2, Mistral-Small-3.2, "
    "Granite-3.3) writes instead, YYYY-MM-DD: the output never depends on the day it is made. "
    "[default: 2025-01-01]"
)


def template_date_option(help_prefix: str = ""):
    import typer

    return typer.Option(
        None, "--template-date", metavar="YYYY-MM-DD", help=help_prefix + TEMPLATE_DATE_HELP
    )


def raw_option(key: str):
    """pack's and verify's option `key` of the tokenizer (each only with --tokenizer)."""
    import typer

    from packer.cli.app import choices

    with_tokenizer = "With --tokenizer: "
    if key == "chat_template":
        return typer.Option(None, "--chat-template", help=with_tokenizer + TEMPLATE_HELP)
    if key == "train_on":
        return typer.Option(
            None, "--train-on", metavar=choices(TRAIN_ON), help=with_tokenizer + TRAIN_ON_HELP
        )
    if key == "template_date":
        return template_date_option(with_tokenizer)
    if key == "turns":
        return typer.Option(
            None, "--turns", metavar=choices(TURNS), help=with_tokenizer + TURNS_HELP
        )
    flag = MASK_FLAGS[key]
    helps = {"train_reasoning": TRAIN_REASONING_HELP, "train_tool_calls": TRAIN_TOOL_CALLS_HELP}
    return typer.Option(None, f"{flag}/--no-{flag[2:]}", help=with_tokenizer + helps[key])


def mask_options(params: dict) -> dict:
    """The chat-mask options the flags give (None where not given), by Encoder keyword."""
    return {key: params.get(key) for key in MASK_FLAGS}


def given_mask_flag(options: dict) -> str | None:
    return next((MASK_FLAGS[k] for k, v in (options or {}).items() if v is not None), None)


def with_mask_options(key: str | None, options: dict) -> str | None:
    """A local tokenizer's cache key (`local_tokenizer_key`) that also holds the chat-mask
    options, so that packs under other options never share an entry."""
    import hashlib
    import json

    if key is None:
        return None
    from packer.tokenize.clock import template_date

    defaults = {"train_reasoning": True, "train_tool_calls": True, "turns": "all"}
    defaults["template_date"] = template_date(None)
    chosen = {k: (defaults[k] if v is None else v) for k, v in options.items()}
    chosen["template_date"] = template_date(chosen.get("template_date"))  # 2025-01-01 as given
    digest = hashlib.sha256(json.dumps(chosen, sort_keys=True).encode()).hexdigest()[:16]
    return f"{key}:{digest}"

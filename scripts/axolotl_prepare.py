"""axolotl's SFT preprocessing of bench_tokenize.py's raw lines, run with axolotl's own python.

    /work/venvs/axolotl/bin/python scripts/axolotl_prepare.py RAW TOKENIZER WORKDIR --workers 2

Splits RAW (JSONL of chats, texts and prompt/completion pairs) into one file per kind, writes an
axolotl config that reads them as axolotl's closest types (chats: `chat_template` with the same
ChatML template, assistant turns and their <|im_end|> trained; texts: `completion`; pairs:
a user-defined instruction format whose prompt is the prompt field alone, completion + EOS
trained), and times axolotl's preprocessing (`prepare_datasets`, what `axolotl preprocess`
calls: `datasets.map` with `dataset_num_proc` = the workers, caching off, the prepared dataset
saved to disk). The config is validated and the tokenizer loaded before the clock starts.
Prints one JSON line: wall and CPU seconds (this process and its map workers), rows, tokens,
trained tokens, and each chat's input_ids in input order (for the caller's reference check).
axolotl needs a model `config.json` beside the tokenizer: a copy of the tokenizer directory
gets a tiny Llama config (no weights; preprocessing loads none).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import time
from pathlib import Path

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def model_dir(tokenizer: Path, work: Path) -> Path:
    """A copy of the tokenizer directory with a tiny Llama config.json: axolotl reads the
    model's config during validation even when it only preprocesses."""
    from transformers import AutoTokenizer

    path = work / "model"
    if not path.exists():
        shutil.copytree(tokenizer, path)
        vocab = len(AutoTokenizer.from_pretrained(str(tokenizer)))
        config = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": vocab,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "max_position_embeddings": 32768,
        }
        (path / "config.json").write_text(json.dumps(config))
    return path


def config(model: Path, work: Path, workers: int, packing: bool) -> dict:
    files = {kind: str(work / f"{kind}.jsonl") for kind in ("chats", "texts", "pairs")}
    return {
        "base_model": str(model),
        "tokenizer_type": "AutoTokenizer",
        "sequence_len": 8192,
        "sample_packing": packing,
        "pad_to_sequence_len": False,
        "chat_template": "jinja",
        "chat_template_jinja": CHATML,
        "eot_tokens": ["<|im_end|>"],
        "datasets": [
            {
                "path": files["chats"],
                "ds_type": "json",
                "type": "chat_template",
                "field_messages": "messages",
                "roles_to_train": ["assistant"],
                "train_on_eos": "turn",
            },
            {"path": files["texts"], "ds_type": "json", "type": "completion", "field": "text"},
            {
                "path": files["pairs"],
                "ds_type": "json",
                "type": {
                    "field_instruction": "prompt",
                    "field_output": "completion",
                    "format": "{instruction}",
                    "no_input_format": "{instruction}",
                },
            },
        ],
        "train_on_inputs": False,
        "shuffle_merged_datasets": False,
        "dataset_num_proc": workers,
        "dataset_prepared_path": str(work / "prepared"),
        "output_dir": str(work / "out"),
        "micro_batch_size": 1,
        "gradient_accumulation_steps": 1,
        "num_epochs": 1,
        "learning_rate": 1e-4,
        "optimizer": "adamw_torch",
        "attn_implementation": "sdpa",
        "bf16": False,
        "fp16": False,
        "tf32": False,
        "seed": 0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("raw", type=Path)
    ap.add_argument("tokenizer", type=Path)
    ap.add_argument("work", type=Path, help="a fresh directory per run")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--sample-packing", action="store_true")
    args = ap.parse_args()
    os.environ["AXOLOTL_IS_PREPROCESS"] = "1"  # what `axolotl preprocess` sets
    os.environ.setdefault("AXOLOTL_DO_NOT_TRACK", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import yaml
    from axolotl.cli.config import load_cfg
    from axolotl.loaders import load_tokenizer
    from axolotl.utils.data import prepare_datasets
    from axolotl.utils.trainer import disable_datasets_caching

    args.work.mkdir(parents=True, exist_ok=True)
    cfg_path = args.work / "axolotl.yaml"
    model = model_dir(args.tokenizer, args.work)
    cfg_path.write_text(yaml.safe_dump(config(model, args.work, args.workers, args.sample_packing)))
    # validation reads the datasets' paths: the files exist (empty) before the clock starts
    for kind in ("chats", "texts", "pairs"):
        (args.work / f"{kind}.jsonl").touch()
    cfg = load_cfg(str(cfg_path))
    cfg.is_preprocess = True
    tokenizer = load_tokenizer(cfg)

    t0, c0 = time.perf_counter(), time.process_time() + children_cpu()
    out = {"chats": [], "texts": [], "pairs": []}
    with open(args.raw, encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            kind = "chats" if "messages" in row else "texts" if "text" in row else "pairs"
            out[kind].append(line)
    for kind, lines in out.items():
        (args.work / f"{kind}.jsonl").write_text("".join(lines))
    with disable_datasets_caching():
        train, _, _, _ = prepare_datasets(cfg, tokenizer)
    wall, cpu = time.perf_counter() - t0, time.process_time() + children_cpu() - c0

    ids = train["input_ids"]
    labels = train["labels"]
    result = {
        "wall": wall,
        "cpu": cpu,
        "rows": len(ids),
        "tokens": sum(map(len, ids)),
        "trained": sum(sum(x != -100 for x in row) for row in labels),
        "chat_ids": ids[: len(out["chats"])],
        "columns": train.column_names,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""The human verify report: every check's line says what ran and the numbers that matter, a
check that did not run says so, and the verdict says when attention was not checked."""

from __future__ import annotations

from rich.console import Console

from packer.cli.render_verify import verify_table
from packer.verify.result import CheckResult, Failure, VerifyResult

DETAILS = {
    "structure": {"rows": 214, "samples": 1500, "tokens": 436230, "shards": 1},
    "manifest": {"shards": 3},
    "input": {"samples": 1500},
    "attention": {
        "backend": "cpu",
        "device": "cpu",
        "dtype": "fp32",
        "rows": 16,
        "samples": 160,
        "max_isolated_diff": 4.172e-07,
        "max_reference_diff": 5.5e-07,
        "tolerance": 1e-05,
        "seconds_per_million_tokens": 224.3719,
    },
    "negative_control": {
        "min_leak": 2.2984,
        "max_leak": 3.8524,
        "samples_measured": 144,
        "threshold": 0.0001,
        "synthetic": True,
    },
    "model": {
        "samples": 160,
        "max_loss_diff": 8.29e-08,
        "max_logits_diff": 3.58e-07,
        "control_min_logits_leak": 0.5687,
    },
    "user_model": {
        "model": "LlamaForCausalLM",
        "weights": "weights from the checkpoint",
        "attn_implementation": "eager",
        "dtype": "float32",
        "samples": 18,
        "max_logits_diff": 1.79e-07,
        "max_loss_diff": 1.06e-06,
        "tolerance": 0.0001,
        "control_min_logits_leak": 0.3293,
    },
}

LINES = {
    "structure": "214 rows, 1,500 samples, 436,230 tokens in 1 shard",
    "manifest": "3 shards: counts and hashes",
    "input": "1,500 source samples, tokens and labels",
    "attention": "cpu (cpu, fp32), 16 rows / 160 samples: packed vs alone max diff 4.17e-07, "
    "vs fp32 reference 5.5e-07 (tolerance 1e-05); 224 s per million tokens",
    "negative_control": "plain causal leaks 2.3..3.85 into 144 later samples (two joined "
    "samples) (must exceed 0.0001)",
    "model": "160 samples: loss diff 8.29e-08, logits diff 3.58e-07; causal-mask control 0.569",
    "user_model": "LlamaForCausalLM (weights from the checkpoint; eager, float32), 18 samples: "
    "logits diff 1.79e-07, loss diff 1.06e-06 (tolerance 0.0001); one-sequence control 0.329",
}


def render(result: VerifyResult) -> list[str]:
    console = Console(record=True, width=400, color_system=None)
    console.print(verify_table(result))
    return [" ".join(line.split()) for line in console.export_text().splitlines()]


def test_every_check_line_says_what_was_measured():
    checks = {name: CheckResult(name, details=dict(d)) for name, d in DETAILS.items()}
    lines = render(VerifyResult("out/demo", checks))
    assert lines[0] == "packer verify → out/demo: passed"
    for name, text in LINES.items():
        assert any(f"│ {name} │ ok │ {text} │" in line for line in lines), (name, lines)


def test_failed_and_not_run_checks():
    checks = {name: CheckResult(name, details=dict(d)) for name, d in DETAILS.items()}
    for _ in range(2):
        checks["structure"].fail(Failure("x"))
    checks["attention"] = CheckResult("attention", ran=False, skipped_reason="--no-attention")
    checks["negative_control"].details.update(synthetic=False, min_leak=None)
    lines = render(VerifyResult("o", checks))
    assert lines[0] == "packer verify → o: FAILED (attention not checked)"
    assert any("│ structure │ 2 failed │ 214 rows" in line for line in lines)
    assert any("│ attention │ skipped │ --no-attention │" in line for line in lines)
    assert any(
        "│ negative_control │ ok │ plain causal leaks -..3.85 into 144 later samples (must" in line
        for line in lines
    )


def test_verdict_without_an_attention_check_at_all():
    checks = {"structure": CheckResult("structure", details=dict(DETAILS["structure"]))}
    assert (
        render(VerifyResult("o", checks))[0] == "packer verify → o: passed (attention not checked)"
    )
    assert render(VerifyResult("o", checks))[-2].startswith("│ structure │ ok │ 214 rows")


def test_the_whole_table_as_a_terminal_shows_it():
    """Header, column names, title placement and borders, at a fixed width."""
    checks = {
        "structure": CheckResult("structure", details={"rows": 3, "samples": 5, "tokens": 40}),
        "manifest": CheckResult("manifest", details={"shards": 1}),
        "input": CheckResult("input", ran=False, skipped_reason="no --input given"),
    }
    checks["structure"].details["shards"] = 1
    checks["manifest"].fail(Failure("x"))
    console = Console(record=True, width=80, color_system=None)
    console.print(verify_table(VerifyResult("out", checks)))
    assert console.export_text() == (
        "packer verify → out: FAILED (attention not checked)               \n"
        "┏━━━━━━━━━━━┳━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┓\n"
        "┃ check     ┃ result   ┃ details                                 ┃\n"
        "┡━━━━━━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┩\n"
        "│ structure │ ok       │ 3 rows, 5 samples, 40 tokens in 1 shard │\n"
        "│ manifest  │ 1 failed │ 1 shard: counts and hashes              │\n"
        "│ input     │ skipped  │ no --input given                        │\n"
        "└───────────┴──────────┴─────────────────────────────────────────┘\n"
    )

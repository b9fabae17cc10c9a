"""A tiny randomly initialised Llama-style causal LM, built from a config (no download).

Used by `packer verify --model-check` and the training example to show that packed rows give
the same per-sample loss as the samples run alone. Needs torch and transformers.
"""

from __future__ import annotations


def build_tiny_model(
    seed: int = 0,
    vocab_size: int = 32000,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    max_positions: int = 16384,
    attn_implementation: str = "sdpa",
):
    """A 2-layer Llama with random weights, in fp32 eval mode (dropout off).

    Every other setting is the library default, `use_cache=True` included: a forward that does
    not pass `use_cache=False` builds a cache and skips transformers' packed-sample detection,
    exactly as a real checkpoint would.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=max(1, num_heads // 2),
        max_position_embeddings=max_positions,
        attention_dropout=0.0,
    )  # use_cache stays at the library default (True), as in from_pretrained checkpoints
    config._attn_implementation = attn_implementation
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = LlamaForCausalLM(config)
    finally:
        torch.random.set_rng_state(generator_state)
    return model.float().eval()

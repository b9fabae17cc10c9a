"""A tiny randomly initialised Llama-style causal LM, built from a config (no download).

Used by `packer verify --model-check` and the training example to show that packed rows give
the same per-sample loss as the samples run alone. `tiny_config(arch)` gives tiny configs of
the hybrid (Mamba2, Gated DeltaNet, short convolution) and sliding-window architectures, for
`verify --model` and its tests. Needs torch and transformers.
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


# tiny configs of the architectures people pack for: (config class, its settings). Hybrids mix
# attention with Mamba2 / Gated DeltaNet / short-convolution layers; the sliding-window ones
# use `sliding_window` (all their layers sliding where the config allows it).
_BASE = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4}
_HEADS = {**_BASE, "num_key_value_heads": 2, "head_dim": 8}
_DELTA = {
    "num_hidden_layers": 2,
    "layer_types": ["linear_attention", "full_attention"],
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
}
TINY_ARCHITECTURES = {
    "nemotron_h": (
        "NemotronHConfig",
        {
            **_HEADS,
            "layers_block_type": ["linear_attention", "full_attention", "mlp"],
            "ssm_state_size": 8,
            "mamba_num_heads": 4,
            "mamba_head_dim": 16,
            "n_groups": 1,
            "chunk_size": 8,
        },
    ),
    "bamba": (
        "BambaConfig",
        {
            **_HEADS,
            "num_hidden_layers": 2,
            "attn_layer_indices": [1],
            "mamba_n_heads": 4,
            "mamba_d_state": 8,
            "mamba_n_groups": 1,
            "mamba_chunk_size": 8,
        },
    ),
    "falcon_h1": (
        "FalconH1Config",
        {
            **_HEADS,
            "num_hidden_layers": 2,
            "mamba_d_ssm": 64,
            "mamba_n_heads": 4,
            "mamba_d_state": 8,
            "mamba_n_groups": 1,
            "mamba_chunk_size": 8,
        },
    ),
    "lfm2": (
        "Lfm2Config",
        {**_BASE, "num_key_value_heads": 2, "num_hidden_layers": 2, "full_attn_idxs": [1]},
    ),
    "qwen3_next": (
        "Qwen3NextConfig",
        {
            **_HEADS,
            **_DELTA,
            "num_experts": 2,
            "num_experts_per_tok": 1,
            "moe_intermediate_size": 16,
            "shared_expert_intermediate_size": 16,
        },
    ),
    "qwen3_5": ("Qwen3_5TextConfig", {**_HEADS, **_DELTA}),
    "gemma2": (
        "Gemma2Config",
        {**_HEADS, "num_hidden_layers": 2, "layer_types": ["sliding_attention"] * 2},
    ),
    "gemma3": (
        "Gemma3TextConfig",
        {**_HEADS, "num_hidden_layers": 2, "layer_types": ["sliding_attention"] * 2},
    ),
    "gemma4": (  # its config makes the last layer full attention
        "Gemma4TextConfig",
        {
            **_HEADS,
            "num_hidden_layers": 2,
            "layer_types": ["sliding_attention", "full_attention"],
            "hidden_size_per_layer_input": 8,
        },
    ),
    "gpt_oss": (
        "GptOssConfig",
        {
            **_HEADS,
            "num_hidden_layers": 2,
            "layer_types": ["sliding_attention"] * 2,
            "num_local_experts": 2,
            "num_experts_per_tok": 1,
        },
    ),
    "mistral": ("MistralConfig", {**_HEADS, "num_hidden_layers": 2}),
}


def tiny_config(
    arch: str,
    vocab_size: int = 512,
    sliding_window: int | None = None,
    attn_implementation: str | None = None,
):
    """A tiny transformers config of `arch` (a key of TINY_ARCHITECTURES), or None when the
    installed transformers lacks that architecture."""
    import transformers

    class_name, settings = TINY_ARCHITECTURES[arch]
    cls = getattr(transformers, class_name, None)
    if cls is None:
        return None
    extra = {"sliding_window": sliding_window} if sliding_window is not None else {}
    if arch == "gemma4":
        extra["vocab_size_per_layer_input"] = vocab_size
    config = cls(vocab_size=vocab_size, **settings, **extra)
    if attn_implementation:
        config._attn_implementation = attn_implementation
    return config

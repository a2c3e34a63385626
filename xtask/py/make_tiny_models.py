"""Writes seeded tiny random checkpoints for the parity harness.

Each model is a directory shaped like a Hugging Face checkpoint (config.json +
model.safetensors, or shards with model.safetensors.index.json) with HF tensor names
(per-expert MoE weights, rotary inv_freq buffers, a redundant lm_head where the real
checkpoints have one). Quantized variants are written by mlx-lm's own
`quantize_model` / `save_model` / `save_config`, so they are in mlx-community format.

usage: make_tiny_models.py OUT_DIR [--only NAME[,NAME...]] [--list]
"""

import argparse
import copy
import json
import shutil
import sys
import zlib
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.utils import _get_classes, load_model, quantize_model, save_config, save_model

import olmo_compat  # noqa: F401  (mlx-lm's olmo.py made runnable, see there)

BASE = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "vocab_size": 128,
    "max_position_embeddings": 256,
}
# Small enough to commit as goldens (affine quantization needs group size 32 here).
SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2}

ARCHS = {
    "llama": {"model_type": "llama", "rope_theta": 10000.0, "tie_word_embeddings": True},
    "qwen2": {"model_type": "qwen2", "rope_theta": 1000000.0, "tie_word_embeddings": True},
    "qwen3": {
        "model_type": "qwen3",
        "head_dim": 16,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
    },
    "phi3": {"model_type": "phi3", "rope_theta": 10000.0, "tie_word_embeddings": False},
    "cohere2": {"model_type": "cohere2", "head_dim": 16, "num_hidden_layers": 4, "rope_theta": 50000.0,
                "layer_norm_eps": 1e-5, "logit_scale": 0.25, "sliding_window": 4, "sliding_window_pattern": 4},
    # `layer_types` as the real configs carry it (mlx-lm ignores it; transformers' config
    # class reads it instead of the "LLLG" pattern string).
    "exaone4": {"model_type": "exaone4", "head_dim": 16, "rope_theta": 1000000.0, "tie_word_embeddings": False,
                "rope_scaling": None, "sliding_window": 4, "sliding_window_pattern": "LLLG",
                "num_hidden_layers": 4,
                "layer_types": ["sliding_attention"] * 3 + ["full_attention"]},
    "gemma": {"model_type": "gemma", "head_dim": 16, "rms_norm_eps": 1e-6},
    "gemma2": {
        "model_type": "gemma2",
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "query_pre_attn_scalar": 16.0,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
    },
    "gemma3_text": {
        "model_type": "gemma3_text",
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "query_pre_attn_scalar": 16,
        "sliding_window": 4,
        "sliding_window_pattern": 2,
        "rope_local_base_freq": 10000.0,
        "rope_theta": 1000000.0,
    },
    # Gemma 4: sliding/full pattern 3 (S S F S S F), the last three layers reading the
    # keys and values of layers 1 (sliding) and 2 (full), full layers with their own
    # head size and proportional RoPE, per-layer input embeddings, double-wide MLPs on
    # the KV-shared layers.
    "gemma4_text": {
        "model_type": "gemma4_text",
        "num_hidden_layers": 6,
        "head_dim": 16,
        "global_head_dim": 32,
        "rms_norm_eps": 1e-6,
        "sliding_window": 4,
        "sliding_window_pattern": 3,
        "num_kv_shared_layers": 3,
        "hidden_size_per_layer_input": 8,
        "vocab_size_per_layer_input": 128,
        "final_logit_softcapping": 30.0,
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                               "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
    },
    # Gemma 3n's text model (written with its `gemma3n` wrapper config): sliding and
    # full layers alternating, the last two reading the caches of layers 0 and 1, AltUp
    # over 4 copies, LAuReL rank 8, sparse activations on the first two layers.
    "gemma3n": {
        "model_type": "gemma3n_text",
        "num_hidden_layers": 4,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "num_kv_shared_layers": 2,
        "vocab_size_per_layer_input": 128,
        "sliding_window": 4,
        "rope_local_base_freq": 10000.0,
        "rope_theta": 1000000.0,
        "final_logit_softcapping": 30.0,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "activation_sparsity_pattern": [0.95, 0.95, 0.0, 0.0],
        "hidden_size_per_layer_input": 8,
        "altup_num_inputs": 4,
        "altup_coef_clip": 120.0,
        "altup_correct_scale": True,
        "altup_active_idx": 0,
        "laurel_rank": 8,
    },
    "qwen2_moe": {
        "model_type": "qwen2_moe",
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 64,
        "rope_theta": 1000000.0,
    },
    "qwen3_moe": {
        "model_type": "qwen3_moe",
        "head_dim": 16,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [1],
        "moe_intermediate_size": 64,
        "norm_topk_prob": True,
    },
    # Gated delta-net layers with full attention on every second layer (mlx-lm masks
    # full attention with layer `full_attention_interval - 1`'s cache, so the interval
    # must not exceed the layer count), experts on every layer but the dense third.
    "qwen3_next": {
        "model_type": "qwen3_next",
        "num_hidden_layers": 4,
        "head_dim": 16,
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
        "tie_word_embeddings": False,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 8,
        "linear_conv_kernel_dim": 4,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "shared_expert_intermediate_size": 32,
        "mlp_only_layers": [2],
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
        "full_attention_interval": 2,
    },
    # Qwen3.5: the same layers with four linear-attention projections and mlx-lm's
    # rope_parameters handling; the MoE twin nests its text model in `text_config`.
    "qwen3_5": {
        "model_type": "qwen3_5",
        "num_hidden_layers": 4,
        "head_dim": 16,
        "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                            "mrope_section": [1, 1, 0], "mrope_interleaved": True},
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 8,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": 2,
    },
    "qwen3_5_moe": {
        "model_type": "qwen3_5_moe",
        "num_hidden_layers": 4,
        "head_dim": 16,
        "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 8,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": 2,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "shared_expert_intermediate_size": 32,
        "moe_intermediate_size": 32,
    },
    # Short-convolution layers with attention on layers 1 and 3 (the feed-forward size
    # auto-adjusted: int(2 * 128 / 3) rounded up to 64 -> 128).
    "lfm2": {
        "model_type": "lfm2",
        "num_hidden_layers": 4,
        "norm_eps": 1e-5,
        "conv_bias": False,
        "conv_L_cache": 3,
        "block_dim": 64,
        "block_ff_dim": 128,
        "block_multiple_of": 64,
        "block_ffn_dim_multiplier": 1.0,
        "block_auto_adjust_ff_dim": True,
        "rope_theta": 1000000.0,
        "full_attn_idxs": [1, 3],
        "layer_types": ["conv", "full_attention", "conv", "full_attention"],
    },
    # LFM2 with a dense first layer and sigmoid-routed experts after it (the router's
    # expert_bias only picks them).
    "lfm2_moe": {
        "model_type": "lfm2_moe",
        "num_hidden_layers": 4,
        "norm_eps": 1e-5,
        "conv_bias": False,
        "conv_L_cache": 3,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "norm_topk_prob": True,
        "use_expert_bias": True,
        "num_dense_layers": 1,
        "rope_theta": 1000000.0,
        "full_attn_idxs": [1, 3],
        "layer_types": ["conv", "full_attention", "conv", "full_attention"],
    },
    # Mamba-2 mixer (8 heads of 8 in 2 groups, state 16) and attention side by side in
    # every layer; HF layout (convolutions [C, 1, K]), so sanitize folds the multipliers.
    "falcon_h1": {
        "model_type": "falcon_h1",
        "head_dim": 16,
        "mamba_d_ssm": 64,
        "mamba_n_heads": 8,
        "mamba_d_head": 8,
        "mamba_d_state": 16,
        "mamba_n_groups": 2,
        "mamba_d_conv": 4,
        "mamba_chunk_size": 16,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
    },
    # Every layer a Mamba-2 block (16 heads of 8 in 2 groups, state 16; transformers'
    # config check wants num_heads * head_dim = expand * hidden_size).
    "mamba2": {
        "model_type": "mamba2",
        "num_heads": 16,
        "head_dim": 8,
        "expand": 2,
        "state_size": 16,
        "layer_norm_epsilon": 1e-5,
        "conv_kernel": 4,
        "n_groups": 2,
        "use_bias": False,
        "use_conv_bias": True,
        "tie_word_embeddings": False,
        "time_step_limit": [0.001, 100.0],
        "time_step_rank": "auto",
    },
    # Granite 4 hybrid: mamba layers around one attention layer, experts beside a
    # shared MLP, Granite's multipliers (transformers' config check wants
    # mamba_n_heads * mamba_d_head = mamba_expand * hidden_size).
    "granitemoehybrid": {
        "model_type": "granitemoehybrid",
        "num_hidden_layers": 4,
        "intermediate_size": 32,
        "layer_types": ["mamba", "attention", "mamba", "mamba"],
        "attention_bias": False,
        "embedding_multiplier": 12.0,
        "attention_multiplier": 0.0625,
        "logits_scaling": 4.0,
        "residual_multiplier": 0.22,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "shared_intermediate_size": 64,
        "mamba_n_heads": 16,
        "mamba_d_head": 8,
        "mamba_expand": 2,
        "mamba_proj_bias": False,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_n_groups": 1,
        "mamba_conv_bias": True,
        "tie_word_embeddings": True,
        "time_step_limit": [0.001, 100.0],
        "rope_theta": 10000.0,
        "position_embedding_type": "rope",
    },
    # Nemotron-H: mamba mixers, attention without RoPE and squared-ReLU MLP blocks
    # (the pattern as HF writes it, a string); time_step_limit left to its (0, inf).
    "nemotron_h": {
        "model_type": "nemotron_h",
        "attention_bias": False,
        "mamba_num_heads": 8,
        "mamba_head_dim": 8,
        "mamba_proj_bias": False,
        "ssm_state_size": 16,
        "conv_kernel": 4,
        "n_groups": 2,
        "mlp_bias": False,
        "layer_norm_epsilon": 1e-5,
        "use_bias": False,
        "use_conv_bias": True,
        "hybrid_override_pattern": "M-*M-",
    },
    # Mamba: selective scan one token at a time (intermediate = 2 * hidden).
    "mamba": {
        "model_type": "mamba",
        "intermediate_size": 128,
        "state_size": 16,
        "conv_kernel": 4,
        "use_bias": False,
        "use_conv_bias": True,
        "time_step_rank": "auto",
        "tie_word_embeddings": True,
        "expand": 2,
    },
    "glm4": {"model_type": "glm4", "head_dim": 16, "attention_bias": True, "partial_rotary_factor": 0.5,
             "rope_theta": 10000.0},
    "gpt_oss": {
        "model_type": "gpt_oss",
        "head_dim": 16,
        "intermediate_size": 64,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": 4,
        "rope_theta": 150000.0,
    },
    "granite": {
        "model_type": "granite",
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "mlp_bias": False,
        "logits_scaling": 4.0,
        "attention_multiplier": 0.0625,
        "embedding_multiplier": 12.0,
        "residual_multiplier": 0.22,
    },
    "olmo2": {"model_type": "olmo2", "rope_theta": 500000.0, "tie_word_embeddings": False},
    "starcoder2": {"model_type": "starcoder2", "norm_epsilon": 1e-5, "rope_theta": 100000.0,
                   "tie_word_embeddings": True},
    "olmo3": {"model_type": "olmo3", "rope_theta": 500000.0, "sliding_window": 4,
              "num_hidden_layers": 4},
    "seed_oss": {"model_type": "seed_oss", "head_dim": 16, "rope_theta": 10000000.0, "attention_bias": True,
                 "attention_out_bias": False, "tie_word_embeddings": True},
    "smollm3": {
        "model_type": "smollm3",
        "rope_theta": 5000000.0,
        "tie_word_embeddings": True,
        "no_rope_layer_interval": 2,
    },
    "ministral3": {
        "model_type": "ministral3",
        "head_dim": 16,
        "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
                            "llama_4_scaling_beta": 0.1, "rope_theta": 1000000.0,
                            "beta_fast": 32.0, "beta_slow": 1.0},
    },
    "mixtral": {
        "model_type": "mixtral",
        "rope_theta": 1000000.0,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "tie_word_embeddings": False,
    },
}

# Issue 26, dense and MoE families (one entry each).
ARCHS.update({
    "olmoe": {"model_type": "olmoe", "rope_theta": 10000.0, "num_experts": 4, "num_experts_per_tok": 2},
    "mimo": {"model_type": "mimo", "rope_theta": 640000.0, "num_nextn_predict_layers": 1},
    "helium": {"model_type": "helium", "rope_theta": 100000.0, "attention_bias": False, "mlp_bias": False,
               "head_dim": 16, "tie_word_embeddings": False},
    "ernie4_5": {"model_type": "ernie4_5", "rope_theta": 500000.0, "use_bias": False, "head_dim": 16,
                 "tie_word_embeddings": True},
    "internlm3": {"model_type": "internlm3", "rope_theta": 50000000.0, "tie_word_embeddings": False},
    "glm4_moe": {"model_type": "glm4_moe", "head_dim": 16, "moe_intermediate_size": 64, "norm_topk_prob": True,
                 "n_group": 2, "topk_group": 1, "n_shared_experts": 1, "n_routed_experts": 8,
                 "routed_scaling_factor": 2.5, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
                 "num_hidden_layers": 3, "rope_theta": 1000000.0, "rope_scaling": None, "use_qk_norm": True,
                 "tie_word_embeddings": False, "attention_bias": True, "partial_rotary_factor": 0.5},
    "ernie4_5_moe": {"model_type": "ernie4_5_moe", "rope_theta": 500000.0, "use_bias": False, "head_dim": 16,
                     "tie_word_embeddings": True, "moe_num_experts": 4, "moe_k": 2, "moe_intermediate_size": 64,
                     "moe_num_shared_experts": 1, "moe_layer_start_index": 1, "num_hidden_layers": 3},
    "hunyuan_v1_dense": {"model_type": "hunyuan_v1_dense", "rope_theta": 10000.0, "head_dim": 16,
                         "rope_scaling": {"alpha": 1000.0, "factor": 1.0, "type": "dynamic"}},
})

# Issue 26, multi-head latent attention (MLA) families.
DEEPSEEK_V3 = {"model_type": "deepseek_v3", "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 32,
               "kv_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 32, "v_head_dim": 32,
               "n_routed_experts": 8, "n_shared_experts": 1, "n_group": 2, "topk_group": 1, "num_experts_per_tok": 2,
               "moe_intermediate_size": 32, "first_k_dense_replace": 1, "num_hidden_layers": 3,
               "routed_scaling_factor": 2.5, "rope_theta": 10000.0, "norm_topk_prob": True, "topk_method": "noaux_tc",
               "rms_norm_eps": 1e-6}
ARCHS.update({
    "deepseek_v3": DEEPSEEK_V3,
    "glm4_moe_lite": dict(DEEPSEEK_V3, model_type="glm4_moe_lite", rope_theta=1000000.0, rms_norm_eps=1e-5,
                          tie_word_embeddings=False, num_nextn_predict_layers=1),
    # The indexer keeps 8 of the cached positions: prompts of 13 and 40 tokens (and
    # the decode steps past 8) take the sparse path, shorter ones the dense one.
    "deepseek_v32": dict(DEEPSEEK_V3, model_type="deepseek_v32", index_n_heads=4, index_head_dim=16,
                         index_topk=8),
    # mlx-lm's DeepSeek-V2 needs `rope_scaling` (its YaRN embedding reads `factor`).
    "deepseek_v2": dict(DEEPSEEK_V3, model_type="deepseek_v2", topk_method="gready", n_group=None, topk_group=None,
                        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                      "mscale": 0.707, "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1}),
    # Su-scaled RoPE from `rope_scaling` (required by mlx-lm's MiniCPM3); head_dim 32
    # (nope 24 + rope 8) so the KV cache quantizes with group size 32.
    "minicpm3": {"model_type": "minicpm3", "num_key_value_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 32,
                 "qk_nope_head_dim": 24, "qk_rope_head_dim": 8, "dim_model_base": 16, "scale_depth": 1.4,
                 "scale_emb": 12.0, "rope_theta": 10000.0, "tie_word_embeddings": False,
                 "rope_scaling": {"type": "longrope", "original_max_position_embeddings": 64,
                                  "long_factor": [1.0, 1.5, 2.0, 3.0], "short_factor": [1.0, 1.0, 1.0, 1.0]}},
})

# Issue 26, wave 2 part B: dense and MoE families (one entry each).
ARCHS.update({
    "phi": {"model_type": "phi", "partial_rotary_factor": 0.5, "layer_norm_eps": 1e-5, "rope_theta": 10000.0},
    "phimoe": {"model_type": "phimoe", "num_local_experts": 4, "num_experts_per_tok": 2, "rope_scaling": None,
               "rope_theta": 10000.0, "router_jitter_noise": 0.01},
    "granitemoe": {"model_type": "granitemoe", "rope_theta": 10000.0, "tie_word_embeddings": True,
                   "attention_bias": False, "logits_scaling": 4.0, "attention_multiplier": 0.0625,
                   "embedding_multiplier": 12.0, "residual_multiplier": 0.22, "num_local_experts": 4,
                   "num_experts_per_tok": 2, "intermediate_size": 64},
    "internlm2": {"model_type": "internlm2", "rope_theta": 1000000.0, "bias": False, "tie_word_embeddings": False},
    "exaone": {"model_type": "exaone", "num_layers": 2, "layer_norm_epsilon": 1e-5, "rope_theta": 10000.0,
               "tie_word_embeddings": False},
    "cohere": {"model_type": "cohere", "rope_theta": 8000000.0, "layer_norm_eps": 1e-5, "logit_scale": 0.0625,
               "use_qk_norm": True},
    # Untied only: for a tied config mlx-lm's sanitize adds an lm_head.weight its model lacks.
    "minicpm": {"model_type": "minicpm", "dim_model_base": 16, "scale_depth": 1.4, "scale_emb": 12.0,
                "rope_theta": 10000.0, "tie_word_embeddings": False},
    "nemotron": {"model_type": "nemotron", "hidden_act": "relu2", "norm_eps": 1e-5, "partial_rotary_factor": 0.5,
                 "rope_theta": 10000.0, "tie_word_embeddings": False},
    "gpt_neox": {"model_type": "gpt_neox", "rotary_emb_base": 10000, "rotary_pct": 0.25, "layer_norm_eps": 1e-5,
                 "use_parallel_residual": True},
    "gpt2": {"model_type": "gpt2", "n_ctx": 256, "n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 256,
             "layer_norm_epsilon": 1e-5},
    "gpt_bigcode": {"model_type": "gpt_bigcode", "n_embd": 64, "n_layer": 2, "n_inner": 128, "n_head": 4,
                    "n_positions": 256, "layer_norm_epsilon": 1e-5, "multi_query": True},
    "stablelm": {"model_type": "stablelm", "use_qkv_bias": True, "partial_rotary_factor": 0.25,
                 "layer_norm_eps": 1e-5, "rope_theta": 10000.0, "qk_layernorm": True,
                 "use_parallel_residual": False},
    "dots1": {"model_type": "dots1", "head_dim": 16, "num_hidden_layers": 3, "first_k_dense_replace": 1,
              "moe_intermediate_size": 32, "n_routed_experts": 8, "n_shared_experts": 1, "norm_topk_prob": True,
              "num_experts_per_tok": 2, "rope_theta": 10000.0, "routed_scaling_factor": 2.5, "n_group": 2,
              "topk_group": 1, "tie_word_embeddings": False},
})

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}

# name -> (arch, config overrides, options)
#   dtype: weight dtype; extras: add HF-only tensors that sanitize must drop;
#   wrap_mistral3: the text model inside a mistral3 config with vision weights, named
#   "old" (language_model.*) or "new" (model.language_model.*, lm_head.* at the top);
#   hf_mxfp4: gpt_oss experts as the original checkpoints store them (interleaved
#   gate_up_proj, MXFP4 `_blocks` / `_scales`, `quant_method: mxfp4`);
#   shards: write that many shard files with an index; quant: mlx-lm quantization.
# Gemma 4's MoE layout (26B): experts beside the MLP on every layer, full layers with
# keys as values and their own kv-head count, no per-layer inputs, no shared caches,
# the layer types given explicitly, an untied head.
GEMMA4_MOE = {
    "enable_moe_block": True, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 32,
    "attention_k_eq_v": True, "num_global_key_value_heads": 1, "hidden_size_per_layer_input": 0,
    "num_kv_shared_layers": 0, "use_double_wide_mlp": False, "tie_word_embeddings": False,
    "num_hidden_layers": 4,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
}

VARIANTS = {
    "llama-f32-tied": ("llama", {}, {"extras": True}),
    "llama-f32-untied-bias-gqa4": (
        "llama",
        {"tie_word_embeddings": False, "attention_bias": True, "mlp_bias": True,
         "num_attention_heads": 8, "head_dim": 8},
        {},
    ),
    "llama-f32-hd32": ("llama", {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32}, {}),
    "llama-f32-mha-traditional": ("llama", {"num_key_value_heads": 4, "rope_traditional": True}, {}),
    "llama-f32-rope-llama3": ("llama", {"rope_scaling": LLAMA3}, {}),
    "llama-f32-rope-linear": ("llama", {"rope_scaling": {"type": "linear", "factor": 2.0}}, {}),
    "llama-f32-rope-yarn": ("llama", {"rope_scaling": YARN}, {}),
    "llama-f32-rope-dynamic": (
        "llama", {"rope_scaling": {"type": "dynamic", "factor": 2.0}, "max_position_embeddings": 8}, {}),
    "llama-f32-sliding": (
        "llama", {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 4}, {}),
    "llama-bf16": ("llama", {}, {"dtype": "bfloat16"}),
    "llama-f16": ("llama", {}, {"dtype": "float16"}),
    "mistral-f32-sharded": ("llama", {"model_type": "mistral", "tie_word_embeddings": False}, {"shards": 2}),
    "llama-q4-g32": ("llama", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "llama-q8-g64": ("llama", {"tie_word_embeddings": False}, {"quant": {"bits": 8, "group_size": 64}}),
    "llama-q3-g64": ("llama", {}, {"quant": {"bits": 3, "group_size": 64}}),
    "llama-bf16-q4": ("llama", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
    "llama-mxfp4": ("llama", {}, {"quant": {"mode": "mxfp4"}}),
    "llama-mxfp8": ("llama", {}, {"quant": {"mode": "mxfp8"}}),
    "llama-nvfp4": ("llama", {}, {"quant": {"mode": "nvfp4"}}),
    "llama-q4-mixed": ("llama", {"tie_word_embeddings": False}, {"quant": {"bits": 4, "group_size": 64, "mixed": True}}),
    "qwen2-f32-tied": ("qwen2", {}, {"extras": True}),
    "qwen2-bf16-untied": ("qwen2", {"tie_word_embeddings": False}, {"dtype": "bfloat16"}),
    "qwen2-q4": ("qwen2", {}, {"quant": {"bits": 4, "group_size": 64}}),
    "qwen3-f32-tied": ("qwen3", {}, {}),
    "qwen3-f32-untied-gqa4": ("qwen3", {"tie_word_embeddings": False, "num_attention_heads": 8, "head_dim": 8}, {}),
    "qwen3-bf16": ("qwen3", {}, {"dtype": "bfloat16"}),
    "qwen3-f32-rope-yarn": ("qwen3", {"rope_scaling": YARN}, {}),
    "qwen3-f32-hd32": ("qwen3", {"head_dim": 32}, {}),
    "qwen3-bf16-hd32-q4": ("qwen3", {"head_dim": 32}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
    "qwen3-q8": ("qwen3", {}, {"quant": {"bits": 8, "group_size": 64}}),
    "phi3-f32": ("phi3", {}, {}),
    "phi3-f32-longrope": (
        "phi3",
        {"rope_scaling": {"type": "longrope",
                          "short_factor": [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7],
                          "long_factor": [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5]},
         "max_position_embeddings": 512, "original_max_position_embeddings": 64},
        {},
    ),
    "phi3-f32-partial-rotary": ("phi3", {"partial_rotary_factor": 0.5}, {}),
    "phi3-bf16": ("phi3", {}, {"dtype": "bfloat16"}),
    "phi3-q4": ("phi3", {}, {"quant": {"bits": 4, "group_size": 64}}),
    "cohere2-f32": ("cohere2", {}, {}),
    "cohere2-f32-bias-pattern2": (
        "cohere2", {"attention_bias": True, "layer_norm_bias": True, "sliding_window_pattern": 2}, {}),
    "cohere2-f16": ("cohere2", {}, {"dtype": "float16"}),
    "cohere2-bf16-q4": ("cohere2", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
    "exaone4-f32-hybrid": ("exaone4", {}, {}),
    "exaone4-f32-tied-full-llama3": (
        "exaone4", {"tie_word_embeddings": True, "sliding_window_pattern": None, "sliding_window": None,
                    "num_hidden_layers": 2, "rope_scaling": LLAMA3,
                    "layer_types": ["full_attention"] * 2}, {}),
    "exaone4-bf16-q4": ("exaone4", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
    "gemma-f32": ("gemma", {}, {}),
    "gemma-f32-mha-traditional": ("gemma", {"num_key_value_heads": 4, "rope_traditional": True}, {}),
    "gemma-bf16-q4": ("gemma", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
    "gemma2-f32": ("gemma2", {}, {}),
    "gemma2-bf16": ("gemma2", {}, {"dtype": "bfloat16"}),
    "gemma2-q4": ("gemma2", {}, {"quant": {"bits": 4, "group_size": 64}}),
    "gemma3_text-f32-tied": ("gemma3_text", {}, {}),
    "gemma3_text-f32-untied": ("gemma3_text", {}, {"lm_head": True}),
    "gemma3_text-bf16": ("gemma3_text", {}, {"dtype": "bfloat16"}),
    "gemma3_text-f16": ("gemma3_text", {}, {"dtype": "float16"}),
    "gemma3_text-q4": ("gemma3_text", {}, {"quant": {"bits": 4, "group_size": 64}}),
    "gemma3-f32-multimodal": ("gemma3_text", {}, {"wrap_gemma3": True}),
    "gemma4_text-f32": ("gemma4_text", {}, {}),
    "gemma4_text-f32-moe-keqv-untied": ("gemma4_text", GEMMA4_MOE, {}),
    "gemma4_text-bf16": ("gemma4_text", {}, {"dtype": "bfloat16"}),
    "gemma4_text-q4": ("gemma4_text", {}, {"quant": {"bits": 4, "group_size": 64}}),
    "gemma4_text-bf16-moe-q4": ("gemma4_text", GEMMA4_MOE, {"dtype": "bfloat16",
                                                            "quant": {"bits": 4, "group_size": 32}}),
    "gemma4-f32-multimodal": ("gemma4_text", {}, {"wrap_gemma4": True}),
    "gemma3n-f32": ("gemma3n", {}, {}),
    "gemma3n-f32-sizes-noclip": (
        "gemma3n", {"intermediate_size": [128, 96, 64, 128], "altup_coef_clip": None, "altup_correct_scale": False,
                    "altup_active_idx": 1, "activation_sparsity_pattern": None, "final_logit_softcapping": None,
                    "vocab_size_per_layer_input": 64}, {}),
    "gemma3n-bf16": ("gemma3n", {}, {"dtype": "bfloat16"}),
    "gemma3n-q4": ("gemma3n", {}, {"quant": {"bits": 4, "group_size": 64}}),
    "qwen2_moe-f32": ("qwen2_moe", {}, {}),
    "qwen2_moe-f32-mha-traditional": ("qwen2_moe", {"num_key_value_heads": 4, "rope_traditional": True}, {}),
    "qwen2_moe-bf16-q4": ("qwen2_moe", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 32}}),
    "qwen3_moe-f32": ("qwen3_moe", {}, {}),
    "qwen3_moe-q4": ("qwen3_moe", {}, {"quant": {"bits": 4, "group_size": 64}}),
    "qwen3_next-f32": ("qwen3_next", {}, {}),
    "qwen3_next-f32-tied-interval4": (
        "qwen3_next", {"tie_word_embeddings": True, "full_attention_interval": 4, "mlp_only_layers": [],
                       "linear_num_value_heads": 2, "attention_bias": True}, {}),
    # bfloat16 experts need quantized weights on the CPU (MLX's GatherMM is float32 only).
    "qwen3_next-bf16-q4": ("qwen3_next", {"moe_intermediate_size": 64}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
    "qwen3_next-q4": ("qwen3_next", {}, {"quant": {"bits": 4, "group_size": 64}}),
    "qwen3_5-f32": ("qwen3_5", {}, {}),
    "qwen3_5-f32-tied-bias-interval4": (
        "qwen3_5", {"tie_word_embeddings": True, "attention_bias": True, "full_attention_interval": 4,
                    "rope_parameters": None, "rope_theta": 50000.0, "partial_rotary_factor": 0.5}, {}),
    "qwen3_5-bf16": ("qwen3_5", {}, {"dtype": "bfloat16"}),
    "qwen3_5-q4": ("qwen3_5", {}, {"quant": {"bits": 4, "group_size": 64}}),
    "qwen3_5_moe-f32": ("qwen3_5_moe", {}, {"text_config": True}),
    "qwen3_5_moe-q4": ("qwen3_5_moe", {}, {"text_config": True, "quant": {"bits": 4, "group_size": 64}}),
    "lfm2-f32": ("lfm2", {}, {}),
    "lfm2-f32-bias-layer-types": (
        "lfm2", {"conv_bias": True, "full_attn_idxs": None, "block_ff_dim": None, "intermediate_size": 96,
                 "block_auto_adjust_ff_dim": False, "num_key_value_heads": None,
                 "rope_parameters": {"rope_theta": 50000.0},
                 "layer_types": ["full_attention", "conv", "conv", "full_attention"]}, {}),
    "lfm2-bf16": ("lfm2", {}, {"dtype": "bfloat16"}),
    "lfm2-q4": ("lfm2", {}, {"quant": {"bits": 4, "group_size": 64}}),
    "lfm2_moe-f32": ("lfm2_moe", {}, {}),
    "falcon_h1-f32": ("falcon_h1", {}, {}),
    "falcon_h1-f32-rmsnorm-untied-biases": (
        "falcon_h1", {"mamba_rms_norm": True, "tie_word_embeddings": False, "attention_bias": True,
                      "mlp_bias": True, "mamba_proj_bias": True, "projectors_bias": True,
                      "mamba_conv_bias": False}, {}),
    "falcon_h1-f32-norm-before-gate-traditional": (
        "falcon_h1", {"mamba_rms_norm": True, "mamba_norm_before_gate": True, "rope_traditional": True,
                      "mamba_n_groups": 1}, {}),
    "falcon_h1-bf16": ("falcon_h1", {}, {"dtype": "bfloat16"}),
    "falcon_h1-q4": ("falcon_h1", {"mamba_rms_norm": True}, {"quant": {"bits": 4, "group_size": 32}}),
    "lfm2_moe-f32-nobias-nonorm-scaled-bias-layer-types": (
        "lfm2_moe", {"use_expert_bias": False, "norm_topk_prob": False, "routed_scaling_factor": 2.5,
                     "conv_bias": True, "num_dense_layers": 0, "full_attn_idxs": None,
                     "rope_parameters": {"rope_theta": 50000.0},
                     "layer_types": ["full_attention", "conv", "conv", "full_attention"]}, {}),
    "lfm2_moe-bf16-q4": ("lfm2_moe", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 32}}),
    "lfm2_moe-q4": ("lfm2_moe", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "mamba2-f32": ("mamba2", {}, {}),
    "mamba2-f32-tied-bias-g1": (
        "mamba2", {"tie_word_embeddings": True, "use_bias": True, "use_conv_bias": False, "n_groups": 1,
                   "time_step_limit": [0.0, 10.0], "time_step_rank": 4}, {}),
    "mamba2-bf16": ("mamba2", {}, {"dtype": "bfloat16"}),
    "mamba2-q4": ("mamba2", {}, {"quant": {"bits": 4, "group_size": 64}}),
    "granitemoehybrid-f32": ("granitemoehybrid", {}, {}),
    "granitemoehybrid-f32-dense-nope": (
        "granitemoehybrid", {"num_local_experts": 0, "intermediate_size": 96, "position_embedding_type": "nope",
                             "tie_word_embeddings": False, "attention_bias": True, "mamba_n_groups": 2,
                             "mamba_proj_bias": True, "layer_types": ["attention", "mamba", "mamba", "attention"],
                             "rope_parameters": {"rope_theta": 5000.0}}, {}),
    "granitemoehybrid-q4": ("granitemoehybrid", {}, {"quant": {"bits": 4, "group_size": 64}}),
    "nemotron_h-f32": ("nemotron_h", {}, {}),
    "nemotron_h-f32-block-types-bias": (
        "nemotron_h", {"hybrid_override_pattern": None, "attention_bias": True, "mlp_bias": True,
                       "mamba_proj_bias": True, "use_conv_bias": False, "n_groups": 1, "head_dim": 8,
                       "time_step_limit": [0.001, 50.0],
                       "layers_block_type": ["attention", "mamba", "mlp", "mamba"]}, {}),
    "nemotron_h-q4": ("nemotron_h", {}, {"quant": {"bits": 4, "group_size": 64}}),
    "mamba-f32": ("mamba", {}, {}),
    "falcon_mamba-f32-untied-bias": (
        "mamba", {"model_type": "falcon_mamba", "tie_word_embeddings": False, "use_bias": True,
                  "use_conv_bias": False, "time_step_rank": 8, "mixer_rms_eps": 1e-5}, {}),
    "mamba-q4": ("mamba", {}, {"quant": {"bits": 4, "group_size": 64}}),
    "glm4-f32": ("glm4", {}, {}),
    "glm4-f32-nobias-full-rotary-halves": (
        "glm4", {"attention_bias": False, "partial_rotary_factor": 1.0, "rope_traditional": False}, {}),
    "glm4-bf16-q4": ("glm4", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
    "gpt_oss-f32": ("gpt_oss", {}, {}),
    "gpt_oss-f32-full-first-yarn": (
        "gpt_oss", {"layer_types": ["full_attention", "sliding_attention"], "rope_scaling": YARN}, {}),
    "gpt_oss-bf16-mxfp4": ("gpt_oss", {}, {"dtype": "bfloat16", "quant": {"mode": "mxfp4"}}),
    "gpt_oss-bf16-hf-mxfp4": ("gpt_oss", {}, {"dtype": "bfloat16", "hf_mxfp4": True}),
    "granite-f32-tied": ("granite", {}, {}),
    "granite-f32-untied-bias": (
        "granite", {"tie_word_embeddings": False, "attention_bias": True, "mlp_bias": True}, {}),
    "granite-bf16-q4": ("granite", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
    "olmo2-f32": ("olmo2", {}, {"extras": True}),
    "olmo2-f32-tied-gqa4-bias": (
        "olmo2", {"tie_word_embeddings": True, "num_attention_heads": 8, "head_dim": 8,
                  "attention_bias": True, "mlp_bias": True}, {}),
    "olmo2-bf16-q4": ("olmo2", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
    "starcoder2-f32-tied": ("starcoder2", {}, {}),
    "starcoder2-f32-untied-mha": ("starcoder2", {"tie_word_embeddings": False, "num_key_value_heads": 4}, {}),
    "starcoder2-bf16-q4": ("starcoder2", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
    "olmo3-f32": ("olmo3", {}, {}),
    "olmo3-f32-tied-yarn-layer-list": (
        "olmo3", {"tie_word_embeddings": True, "rope_scaling": YARN, "num_hidden_layers": 3,
                  "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}, {}),
    "olmo3-bf16-q4": ("olmo3", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
    "seed_oss-f32-tied-bias": ("seed_oss", {}, {}),
    "seed_oss-f32-untied-out-bias": (
        "seed_oss", {"tie_word_embeddings": False, "attention_out_bias": True, "mlp_bias": True}, {}),
    # Untied: mlx-lm's tied head is `h @ embed_tokens.weight.T`, which fails on a
    # quantized embedding (ours uses the quantized embedding as the head).
    "seed_oss-bf16-untied-q4": (
        "seed_oss", {"tie_word_embeddings": False}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
    "smollm3-f32-tied": ("smollm3", {}, {"extras": True}),
    "smollm3-f32-layer-list": (
        "smollm3", {"num_hidden_layers": 3, "no_rope_layers": [0, 1, 0], "tie_word_embeddings": False}, {}),
    "smollm3-bf16-q4": ("smollm3", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
    "ministral3-f32-tied": ("ministral3", {}, {"extras": True}),
    "ministral3-f32-sliding-untied": (
        "ministral3", {"tie_word_embeddings": False, "layer_types": ["sliding_attention", "full_attention"],
                       "sliding_window": 4}, {}),
    "ministral3-bf16-q4": ("ministral3", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
    "mistral3-f32-ministral3": ("ministral3", {"tie_word_embeddings": False}, {"wrap_mistral3": "old"}),
    "mistral3-f32-mistral": (
        "llama", {"model_type": "mistral", "tie_word_embeddings": False}, {"wrap_mistral3": "new"}),
    "mixtral-f32": ("mixtral", {}, {}),
    "mixtral-q4": ("mixtral", {}, {"quant": {"bits": 4, "group_size": 64}}),
}

# Issue 26, dense and MoE families.
VARIANTS.update({
    "olmoe-f32": ("olmoe", {}, {}),
    "olmoe-f32-untied-bias-normtopk": (
        "olmoe", {"tie_word_embeddings": False, "attention_bias": True, "norm_topk_prob": True}, {}),
    "olmoe-q4": ("olmoe", {}, {"quant": {"bits": 4, "group_size": 64}}),
    "mimo-f32-mtp": ("mimo", {}, {"extras": True, "mtp": True}),
    "mimo-f32-tied-yarn": ("mimo", {"tie_word_embeddings": True, "rope_scaling": YARN}, {}),
    "mimo-bf16-q4": ("mimo", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
    "helium-f32": ("helium", {}, {}),
    "helium-f32-bias-tied": ("helium", {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True},
                             {}),
    "helium-bf16-q4": ("helium", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
    "ernie4_5-f32-tied": ("ernie4_5", {}, {}),
    "ernie4_5-f32-bias-untied-hd8": (
        "ernie4_5", {"use_bias": True, "tie_word_embeddings": False, "num_attention_heads": 8, "head_dim": 8}, {}),
    "ernie4_5-bf16-q4": ("ernie4_5", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
    "internlm3-f32": ("internlm3", {}, {}),
    "internlm3-f32-bias-tied-dynamic": (
        "internlm3", {"bias": True, "qkv_bias": True, "tie_word_embeddings": True,
                      "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}, "max_position_embeddings": 8}, {}),
    "internlm3-bf16-q4": ("internlm3", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
    "glm4_moe-f32-mtp": ("glm4_moe", {}, {"mtp": True}),
    # n_shared_experts stays an int: transformers' strict config (the generation sweep's
    # tokenizer loading) refuses null.
    "glm4_moe-f32-one-group-noqknorm": (
        "glm4_moe", {"n_group": 1, "topk_group": 1, "n_shared_experts": 2, "use_qk_norm": False,
                     "attention_bias": False, "norm_topk_prob": False, "first_k_dense_replace": 0}, {}),
    "glm4_moe-q4": ("glm4_moe", {}, {"quant": {"bits": 4, "group_size": 64}}),
    "ernie4_5_moe-f32-mtp": ("ernie4_5_moe", {}, {"mtp": True}),
    # Integer layer indices: transformers' strict config class (which the tokenizer loading
    # of the generation sweep goes through) refuses lists.
    "ernie4_5_moe-f32-sigmoid-interval2": (
        "ernie4_5_moe", {"moe_gate_act": "sigmoid", "moe_layer_interval": 2, "moe_layer_start_index": 0,
                         "moe_layer_end_index": 2, "moe_num_shared_experts": 0,
                         "tie_word_embeddings": False}, {}),
    "ernie4_5_moe-q4": ("ernie4_5_moe", {}, {"quant": {"bits": 4, "group_size": 64}}),
    "hunyuan_v1_dense-f32": ("hunyuan_v1_dense", {}, {}),
    "hunyuan_v1_dense-f32-tied-noqk": (
        "hunyuan_v1_dense", {"tie_word_embeddings": True, "attention_bias": True, "use_qk_norm": False,
                             "rope_scaling": None}, {"lm_head": True}),
    "hunyuan_v1_dense-bf16-q4": ("hunyuan_v1_dense", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
    "qwen2_vl-f32-flat": ("qwen2", {}, {"wrap_vl": ("qwen2_vl", "flat")}),
    "qwen2_5_vl-f32-nested-untied": ("qwen2", {"tie_word_embeddings": False}, {"wrap_vl": ("qwen2_5_vl", "nested")}),
    "qwen3_vl-f32-nested-untied": ("qwen3", {"tie_word_embeddings": False}, {"wrap_vl": ("qwen3_vl", "nested")}),
    "qwen3_vl-bf16-q4": ("qwen3", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64},
                                       "wrap_vl": ("qwen3_vl", "flat")}),
})

# SuScaledRoPE with an explicit long_mscale (head size 16: 8 factors each).
PHIMOE_LONGROPE = {"type": "longrope", "short_factor": [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7],
                   "long_factor": [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5], "short_mscale": 1.1,
                   "long_mscale": 1.25}

# Issue 26, wave 2 part B.
VARIANTS.update({
    "phi-f32": ("phi", {}, {}),
    "phi-f32-mha-rotary04": ("phi", {"num_key_value_heads": None, "partial_rotary_factor": 0.4}, {}),
    "phi-bf16": ("phi", {}, {"dtype": "bfloat16"}),
    "phi-bf16-q4": ("phi", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
    "phimoe-f32": ("phimoe", {}, {}),
    "phimoe-f32-longrope": (
        "phimoe", {"rope_scaling": PHIMOE_LONGROPE, "max_position_embeddings": 512,
                   "original_max_position_embeddings": 64, "router_jitter_noise": 0.5}, {}),
    "phimoe-q4": ("phimoe", {}, {"quant": {"bits": 4, "group_size": 64}}),
    "granitemoe-f32-tied": ("granitemoe", {}, {}),
    "granitemoe-f32-untied-bias": ("granitemoe", {"tie_word_embeddings": False, "attention_bias": True}, {}),
    "granitemoe-q4": ("granitemoe", {}, {"quant": {"bits": 4, "group_size": 64}}),
    "internlm2-f32": ("internlm2", {}, {"extras": True}),
    "internlm2-f32-bias-tied-gqa4-dynamic": (
        "internlm2", {"bias": True, "tie_word_embeddings": True, "num_attention_heads": 8,
                      "rope_scaling": {"type": "dynamic", "factor": 2.0}, "max_position_embeddings": 8}, {}),
    "internlm2-bf16-q4": ("internlm2", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
    "exaone-f32": ("exaone", {}, {}),
    "exaone-f32-tied-bias-llama3": (
        "exaone", {"tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True, "rope_scaling": LLAMA3,
                   "head_dim": 8, "num_attention_heads": 8}, {}),
    "exaone-bf16-q4": ("exaone", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
    "cohere-f32-qknorm": ("cohere", {}, {}),
    "cohere-f32-bias-noqknorm": ("cohere", {"use_qk_norm": False, "attention_bias": True, "layer_norm_bias": True},
                                 {}),
    "cohere-bf16-q4": ("cohere", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
    "minicpm-f32": ("minicpm", {}, {}),
    "minicpm-f32-traditional-linear": (
        "minicpm", {"rope_traditional": True, "rope_scaling": {"type": "linear", "factor": 2.0}}, {}),
    "minicpm-bf16-q4": ("minicpm", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
    "nemotron-f32": ("nemotron", {}, {}),
    "nemotron-f32-tied-bias-linear": (
        "nemotron", {"tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True, "head_dim": 8,
                     "num_attention_heads": 8, "rope_scaling": {"type": "linear", "factor": 2.0}}, {}),
    "nemotron-bf16-q4": ("nemotron", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
    "gpt_neox-f32": ("gpt_neox", {}, {"extras": True}),
    "gpt_neox-f32-sequential": ("gpt_neox", {"use_parallel_residual": False, "rotary_pct": 1.0}, {}),
    "gpt_neox-bf16-q4": ("gpt_neox", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
    "gpt2-f32": ("gpt2", {}, {}),
    "gpt2-bf16-q4": ("gpt2", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
    "gpt_bigcode-f32-mqa": ("gpt_bigcode", {}, {}),
    "gpt_bigcode-f32-mha-untied-nobias": (
        "gpt_bigcode", {"multi_query": False, "tie_word_embeddings": False, "attention_bias": False,
                        "mlp_bias": False}, {}),
    "gpt_bigcode-bf16-q4": ("gpt_bigcode", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
    "stablelm-f32-qknorm": ("stablelm", {}, {}),
    "stablelm-f32-parallel-nobias": (
        "stablelm", {"qk_layernorm": False, "use_parallel_residual": True, "use_qkv_bias": False}, {}),
    "stablelm-bf16-q4": ("stablelm", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
    "qwen3_vl_moe-f32-nested": ("qwen3_moe", {}, {"wrap_vl": ("qwen3_vl_moe", "nested"), "fused_vl_experts": True}),
    "qwen3_vl_moe-q4": ("qwen3_moe", {}, {"wrap_vl": ("qwen3_vl_moe", "nested"), "fused_vl_experts": True,
                                          "quant": {"bits": 4, "group_size": 64}}),
    "dots1-f32": ("dots1", {}, {}),
    "dots1-f32-tied-one-group": (
        "dots1", {"n_group": 1, "topk_group": 1, "tie_word_embeddings": True, "n_shared_experts": 2,
                  "norm_topk_prob": False, "first_k_dense_replace": 0, "mlp_bias": True}, {"extras": True}),
    "dots1-q4": ("dots1", {}, {"quant": {"bits": 4, "group_size": 64}}),
})

# Small twins committed under goldens/models/ (checked by `cargo test -p mlx-models`).
GOLDENS = {
    "llama-small-f32-tied": ("llama", dict(SMALL), {"extras": True}),
    "llama-small-bf16-untied-bias": (
        "llama", dict(SMALL, tie_word_embeddings=False, attention_bias=True, mlp_bias=True), {"dtype": "bfloat16"}),
    "llama-small-f32-sliding-llama3": (
        "llama", dict(SMALL, rope_scaling=LLAMA3, layer_types=["sliding_attention", "full_attention"],
                      sliding_window=4), {}),
    "llama-small-f32-hd32": ("llama", dict(SMALL, num_attention_heads=2, num_key_value_heads=1, head_dim=32), {}),
    "llama-small-q4-g32": ("llama", dict(SMALL), {"quant": {"bits": 4, "group_size": 32}}),
    "llama-small-mxfp4": ("llama", dict(SMALL), {"quant": {"mode": "mxfp4"}}),
    "qwen2-small-f32": ("qwen2", dict(SMALL), {}),
    "qwen3-small-bf16": ("qwen3", dict(SMALL, head_dim=8), {"dtype": "bfloat16"}),
    "qwen3-small-q8-g32": ("qwen3", dict(SMALL, head_dim=8), {"quant": {"bits": 8, "group_size": 32}}),
    "phi3-small-f32-longrope": (
        "phi3",
        dict(SMALL, rope_scaling={"type": "longrope", "short_factor": [1.0, 1.1, 1.2, 1.3],
                                  "long_factor": [1.0, 1.5, 2.0, 2.5]},
             max_position_embeddings=512, original_max_position_embeddings=64),
        {},
    ),
    "gemma2-small-f32": ("gemma2", dict(SMALL, head_dim=8, query_pre_attn_scalar=8.0), {}),
    "gemma3_text-small-bf16": ("gemma3_text", dict(SMALL, head_dim=8, query_pre_attn_scalar=8), {"dtype": "bfloat16"}),
    "gemma4_text-small-f32": ("gemma4_text", dict(SMALL, head_dim=8, global_head_dim=16), {}),
    "gemma4_text-small-f32-moe": (
        "gemma4_text", dict(SMALL, **dict(GEMMA4_MOE, moe_intermediate_size=16), head_dim=8, global_head_dim=16),
        {}),
    "gemma3n-small-f32": ("gemma3n", dict(SMALL, head_dim=8), {}),
    "qwen2_moe-small-f32": ("qwen2_moe", dict(SMALL, moe_intermediate_size=32), {}),
    "qwen3_moe-small-f32": (
        "qwen3_moe", dict(SMALL, head_dim=8, moe_intermediate_size=32), {}),
    "qwen3_next-small-f32": (
        "qwen3_next", dict(SMALL, head_dim=8, linear_key_head_dim=8, linear_value_head_dim=8,
                           moe_intermediate_size=16, shared_expert_intermediate_size=16), {}),
    "qwen3_5-small-f32": (
        "qwen3_5", dict(SMALL, head_dim=8, linear_key_head_dim=8, linear_value_head_dim=8), {}),
    "qwen3_5_moe-small-f32": (
        "qwen3_5_moe", dict(SMALL, head_dim=8, linear_key_head_dim=8, linear_value_head_dim=8,
                            moe_intermediate_size=16, shared_expert_intermediate_size=16), {"text_config": True}),
    "lfm2-small-f32": ("lfm2", dict(SMALL, block_dim=32, block_ff_dim=64, block_multiple_of=16), {}),
    "lfm2_moe-small-f32": ("lfm2_moe", dict(SMALL, moe_intermediate_size=16), {}),
    "falcon_h1-small-f32": ("falcon_h1", dict(SMALL, head_dim=8, mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8,
                                              mamba_d_state=8, mamba_n_groups=1, mamba_rms_norm=True), {}),
    "mamba2-small-f32": ("mamba2", dict(SMALL, num_heads=8, head_dim=8, state_size=8), {}),
    "granitemoehybrid-small-f32": (
        "granitemoehybrid", dict(SMALL, intermediate_size=16, shared_intermediate_size=32, mamba_n_heads=8,
                                 mamba_d_state=8), {}),
    "nemotron_h-small-f32": ("nemotron_h", dict(SMALL, mamba_num_heads=4, ssm_state_size=8), {}),
    "mamba-small-f32": ("mamba", dict(SMALL, intermediate_size=64, state_size=8), {}),
    "mixtral-small-f32": ("mixtral", dict(SMALL, intermediate_size=32), {}),
    "ministral3-small-f32-sliding": (
        "ministral3", dict(SMALL, head_dim=8, layer_types=["sliding_attention", "full_attention"],
                           sliding_window=4), {}),
    "cohere2-small-f32": ("cohere2", dict(SMALL, head_dim=8), {}),
    "exaone4-small-f32-hybrid": ("exaone4", dict(SMALL, head_dim=8), {}),
    "gemma-small-f32": ("gemma", dict(SMALL, head_dim=8), {}),
    "glm4-small-f32": ("glm4", dict(SMALL, head_dim=8), {}),
    "gpt_oss-small-f32": ("gpt_oss", dict(SMALL, head_dim=8, intermediate_size=32), {}),
    "granite-small-f32": ("granite", dict(SMALL), {}),
    "olmo2-small-f32": ("olmo2", dict(SMALL), {}),
    "olmo3-small-f32": ("olmo3", dict(SMALL), {}),
    "seed_oss-small-f32": ("seed_oss", dict(SMALL, head_dim=8), {}),
    "smollm3-small-f32": ("smollm3", dict(SMALL), {}),
    "starcoder2-small-f32": ("starcoder2", dict(SMALL), {}),
}

# Issue 26, multi-head latent attention families.
DS_YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "mscale": 1.0,
           "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}
VARIANTS.update({
    "deepseek_v3-f32": ("deepseek_v3", {}, {}),
    "deepseek_v3-f32-noqlora-yarn-bias-freq2": (
        "deepseek_v3", {"q_lora_rank": None, "attention_bias": True, "rope_scaling": DS_YARN, "n_group": 1,
                        "topk_group": 1, "norm_topk_prob": False, "moe_layer_freq": 2, "first_k_dense_replace": 0,
                        "n_shared_experts": 2}, {}),
    "deepseek_v3-q4": ("deepseek_v3", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "deepseek_v3-bf16-q4-kvb": ("deepseek_v3", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 32},
                                                    "kv_b_quantized": True}),
    "kimi_k25-f32": ("deepseek_v3", {}, {"wrap_kimi": True}),
    "deepseek_v3-fp8": ("deepseek_v3", {}, {"fp8": True}),
    "glm4_moe_lite-f32-mtp": ("glm4_moe_lite", {}, {"mtp": True}),
    "deepseek_v32-f32": ("deepseek_v32", {}, {}),
    "deepseek_v32-f32-interleave-yarn-top4-freq2": (
        "deepseek_v32", {"indexer_rope_interleave": True, "rope_scaling": DS_YARN, "index_topk": 4,
                         "attention_bias": True, "n_group": 1, "topk_group": 1, "norm_topk_prob": False,
                         "moe_layer_freq": 2, "first_k_dense_replace": 0, "index_n_heads": 2}, {}),
    "deepseek_v32-q4": ("deepseek_v32", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "deepseek_v32-bf16-q4-kvb": ("deepseek_v32", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 32},
                                                      "kv_b_quantized": True}),
    "deepseek_v32-fp8-mtp": ("deepseek_v32", {}, {"fp8": True, "mtp": True}),
    "glm4_moe_lite-q4": ("glm4_moe_lite", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "deepseek_v2-f32": ("deepseek_v2", {}, {}),
    "deepseek_v2-f32-noqlora-grouplimited-bias-hd32": (
        "deepseek_v2", {"q_lora_rank": None, "attention_bias": True, "topk_method": "group_limited_greedy",
                        "qk_nope_head_dim": 24,
                        "n_group": 2, "topk_group": 1, "moe_layer_freq": 2, "first_k_dense_replace": 0,
                        "rope_scaling": {"type": "yarn", "factor": 1.0}}, {}),
    "deepseek_v2-q4": ("deepseek_v2", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "minicpm3-f32": ("minicpm3", {}, {}),
    "minicpm3-f32-tied-bias-scalarfactor": (
        "minicpm3", {"tie_word_embeddings": True, "attention_bias": True,
                     "rope_scaling": {"type": "longrope", "long_factor": 1.25}}, {}),
    "minicpm3-q4": ("minicpm3", {}, {"quant": {"bits": 4, "group_size": 32}}),
})

# Issue 26, dense and MoE families.
GOLDENS.update({
    "olmoe-small-f32": ("olmoe", dict(SMALL, intermediate_size=32), {}),
    "mimo-small-f32": ("mimo", dict(SMALL), {"mtp": True}),
    "helium-small-f32": ("helium", dict(SMALL, head_dim=8), {}),
    "ernie4_5-small-f32": ("ernie4_5", dict(SMALL, head_dim=8, use_bias=True), {}),
    "internlm3-small-f32": ("internlm3", dict(SMALL, qkv_bias=True, bias=True), {}),
    "glm4_moe-small-f32": ("glm4_moe", dict(SMALL, head_dim=8, moe_intermediate_size=16), {"mtp": True}),
    "ernie4_5_moe-small-f32": ("ernie4_5_moe", dict(SMALL, head_dim=8, moe_intermediate_size=16), {"mtp": True}),
    "qwen2_vl-small-f32": ("qwen2", dict(SMALL), {"wrap_vl": ("qwen2_vl", "flat")}),
    "hunyuan_v1_dense-small-f32": ("hunyuan_v1_dense", dict(SMALL, head_dim=8), {}),
    "qwen3_vl-small-f32": ("qwen3", dict(SMALL, head_dim=8, tie_word_embeddings=False),
                           {"wrap_vl": ("qwen3_vl", "nested")}),
})

# Issue 26, multi-head latent attention families.
MLA_SMALL = dict(SMALL, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8,
                 qk_nope_head_dim=8, v_head_dim=8, moe_intermediate_size=16)
GOLDENS.update({
    "deepseek_v3-small-f32": ("deepseek_v3", MLA_SMALL, {}),
    "kimi_k25-small-f32": ("deepseek_v3", MLA_SMALL, {"wrap_kimi": True}),
    "glm4_moe_lite-small-f32": ("glm4_moe_lite", MLA_SMALL, {"mtp": True}),
    "deepseek_v32-small-f32": ("deepseek_v32", dict(MLA_SMALL, index_n_heads=2, index_head_dim=16, index_topk=4),
                               {"mtp": True}),
    "deepseek_v2-small-f32": ("deepseek_v2", MLA_SMALL, {}),
    "minicpm3-small-f32": ("minicpm3", dict(SMALL, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16,
                                            qk_nope_head_dim=8), {}),
})


# Issue 26, wave 2 part B.
GOLDENS.update({
    "phi-small-f32": ("phi", dict(SMALL), {}),
    "phimoe-small-f32-longrope": (
        "phimoe", dict(SMALL, intermediate_size=32, max_position_embeddings=512, original_max_position_embeddings=64,
                       rope_scaling=dict(PHIMOE_LONGROPE, short_factor=[1.0, 1.1, 1.2, 1.3],
                                         long_factor=[1.0, 1.5, 2.0, 2.5])), {}),
    "granitemoe-small-f32": ("granitemoe", dict(SMALL, intermediate_size=32), {}),
    "internlm2-small-f32-bias": ("internlm2", dict(SMALL, bias=True), {}),
    "exaone-small-f32": ("exaone", dict(SMALL), {}),
    "cohere-small-f32-qknorm": ("cohere", dict(SMALL), {}),
    "minicpm-small-f32": ("minicpm", dict(SMALL), {}),
    "nemotron-small-f32": ("nemotron", dict(SMALL), {}),
    "gpt_neox-small-f32": ("gpt_neox", dict(SMALL), {}),
    "gpt2-small-f32": ("gpt2", dict(SMALL, n_embd=32, n_positions=64, n_ctx=64), {}),
    "gpt_bigcode-small-f32": ("gpt_bigcode", dict(SMALL, n_embd=32, n_inner=64, n_positions=64), {}),
    "stablelm-small-f32-qknorm": ("stablelm", dict(SMALL), {}),
    "qwen3_vl_moe-small-f32": ("qwen3_moe", dict(SMALL, head_dim=8, moe_intermediate_size=32),
                               {"wrap_vl": ("qwen3_vl_moe", "nested"), "fused_vl_experts": True}),
    "dots1-small-f32": ("dots1", dict(SMALL, head_dim=8, moe_intermediate_size=16), {}),
})


# Issue 26, chunked attention (mlx-lm's ChunkedKVCache). Llama 4 needs >= 4 layers (its
# global mask comes from layer 3) and one expert per token; a chunk of 8 (4) is shorter
# than the prompts and the decode prefills, so the chunk mask and maybe_trim_front act,
# and floor_scale 8 makes the global layers' temperature tuning vary with the position.
LLAMA4 = {"model_type": "llama4", "num_hidden_layers": 4, "head_dim": 32, "attention_bias": False,
          "attention_chunk_size": 8, "interleave_moe_layer_step": 2, "intermediate_size": 32,
          "intermediate_size_mlp": 64, "num_local_experts": 4, "num_experts_per_tok": 1,
          "rope_theta": 500000.0, "use_qk_norm": True, "floor_scale": 8, "attn_scale": 0.1,
          "attn_temperature_tuning": True,
          "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 64}}
ARCHS.update({
    "llama4": LLAMA4,
    "llama4_text": {"model_type": "llama4_text", "head_dim": 16, "intermediate_size_mlp": 96,
                    "rope_theta": 500000.0, "tie_word_embeddings": False, "use_qk_norm": True,
                    "num_hidden_layers": 4, "no_rope_layers": [1, 1, 1, 0]},
})
VARIANTS.update({
    "llama4-f32": ("llama4", {}, {}),
    "llama4-f32-allmoe-bias-noqknorm-notuning-chunk4": (
        "llama4", {"interleave_moe_layer_step": 1, "attention_bias": True, "use_qk_norm": False,
                   "attn_temperature_tuning": 0, "rope_scaling": None, "attention_chunk_size": 4,
                   "num_hidden_layers": 5}, {}),
    "llama4-bf16-q4": ("llama4", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 32}}),
    "llama4-q4": ("llama4", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "llama4_text-f32": ("llama4_text", {}, {}),
    "llama4_text-f32-tied-noqknorm": (
        "llama4_text", {"tie_word_embeddings": True, "use_qk_norm": False, "no_rope_layers": [0, 1, 0, 1]}, {}),
    "llama4_text-q4": ("llama4_text", {}, {"quant": {"bits": 4, "group_size": 32}}),
})
ARCHS["minimax"] = {"model_type": "minimax", "head_dim": 16, "rotary_dim": 8, "num_local_experts": 4,
                   "num_experts_per_tok": 2, "intermediate_size": 32, "shared_intermediate_size": 32,
                   "rope_theta": 5000000.0, "use_qk_norm": True, "tie_word_embeddings": False}
VARIANTS.update({
    "minimax-f32": ("minimax", {}, {}),
    "minimax-f32-tied-noqknorm-top1": ("minimax", {"tie_word_embeddings": True, "use_qk_norm": False,
                                                   "num_experts_per_tok": 1, "rotary_dim": 16}, {}),
    "minimax-q4": ("minimax", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "minimax-fp8": ("minimax", {}, {"fp8": True}),
})
GOLDENS.update({
    "minimax-small-f32": ("minimax", dict(SMALL, head_dim=8, rotary_dim=4, intermediate_size=16), {}),
    "llama4-small-f32": ("llama4", dict(SMALL, head_dim=8, intermediate_size=16, intermediate_size_mlp=32), {}),
    "llama4_text-small-f32": ("llama4_text", dict(SMALL, head_dim=8, intermediate_size_mlp=32), {}),
})

# EXAONE MoE: layers 0-2 sliding (with RoPE), 3 full (without), layer 0 dense; the HF
# layout keeps per-expert weights, the correction bias beside the gate and an MTP block.
ARCHS["exaone_moe"] = {"model_type": "exaone_moe", "head_dim": 16, "num_hidden_layers": 4,
                       "moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2,
                       "num_shared_experts": 1, "n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.5,
                       "norm_topk_prob": True, "rope_theta": 1000000.0, "rope_scaling": None,
                       "tie_word_embeddings": False, "sliding_window": 4,
                       "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
                       "is_moe_layer": [False, True, True, True]}
VARIANTS.update({
    "exaone_moe-f32": ("exaone_moe", {}, {}),
    # No sliding layer (RoPE on every layer), tied, one group, no renormalization,
    # no shared experts, MoE and dense layers alternating.
    "exaone_moe-f32-tied-full-onegroup-nonorm-noshared": (
        "exaone_moe", {"tie_word_embeddings": True, "layer_types": ["full_attention"] * 4, "n_group": 1,
                       "topk_group": 1, "norm_topk_prob": False, "num_shared_experts": 0,
                       "is_moe_layer": [True, False, True, False]}, {}),
    # Four groups of which two are kept, top 3, rope_theta from rope_parameters, two
    # shared experts, sliding and full layers alternating, every layer MoE.
    "exaone_moe-f32-groups4-top3-ropeparams": (
        "exaone_moe", {"n_group": 4, "topk_group": 2, "num_experts_per_tok": 3, "num_shared_experts": 2,
                       "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
                       "layer_types": ["full_attention", "sliding_attention"] * 2,
                       "is_moe_layer": [True] * 4, "routed_scaling_factor": 1.5}, {}),
    "exaone_moe-f32-top1": ("exaone_moe", {"num_experts_per_tok": 1}, {}),
    "exaone_moe-q4": ("exaone_moe", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "exaone_moe-bf16-q4": ("exaone_moe", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 32}}),
})
GOLDENS.update({
    "exaone_moe-small-f32": ("exaone_moe", dict(SMALL, head_dim=8, moe_intermediate_size=16), {}),
})

# OLMo (the first release): hf_olmo's config keys; an embedding padded past the
# vocabulary (the logits are `embedding_size` wide), an explicit MLP width.
ARCHS["olmo"] = {"model_type": "olmo", "d_model": 64, "n_layers": 2, "n_heads": 4, "mlp_hidden_size": 128,
                 "embedding_size": 136, "weight_tying": False}
VARIANTS.update({
    "olmo-f32": ("olmo", {"rope_theta": 50000.0}, {}),
    # Tied (mlx-lm's tied head returns a tuple: olmo_compat takes the logits), the MLP
    # width from mlp_ratio, traditional RoPE, three layers (no rope_theta in any but
    # olmo-f32: the default base).
    "olmo-f32-tied-ratio-traditional": (
        "olmo", {"weight_tying": True, "mlp_hidden_size": None, "mlp_ratio": 3, "rope_traditional": True,
                 "n_layers": 3}, {}),
    "olmo-q4": ("olmo", {}, {"quant": {"bits": 4, "group_size": 64}}),
    "olmo-bf16-q4": ("olmo", {"weight_tying": True}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 32}}),
})
GOLDENS.update({
    "olmo-small-f32": ("olmo", dict(SMALL, d_model=32, mlp_hidden_size=64), {}),
})

# Hunyuan MoE (Hunyuan-Large): cross-layer attention (layers 1 and 3 read the k/v
# projections of layers 0 and 2), softmax top-2 of 4 experts beside a shared MLP, q/k
# norms after the alpha-scaled RoPE; HF's per-expert tensors. The head is always the
# embedding (tie_word_embeddings is not read).
ARCHS["hunyuan"] = {"model_type": "hunyuan", "num_hidden_layers": 4, "attention_bias": False, "moe_topk": 2,
                    "num_experts": 4, "num_shared_expert": 1, "use_mixed_mlp_moe": True, "use_qk_norm": True,
                    "rope_theta": 10000.0, "use_cla": True, "cla_share_factor": 2, "moe_intermediate_size": 32,
                    "rope_scaling": {"alpha": 1000.0, "factor": 1.0, "type": "dynamic"}}
VARIANTS.update({
    "hunyuan-f32": ("hunyuan", {}, {}),
    # Per-layer lists for top-k, shared-MLP multiples and expert widths; biases without
    # q/k norms; every third layer makes k/v (layers 1 and 2 read layer 0's).
    "hunyuan-f32-lists-bias-noqknorm-cla3": (
        "hunyuan", {"moe_topk": [1, 2, 3, 2], "num_shared_expert": [1, 2, 1, 2],
                    "moe_intermediate_size": [32, 16, 32, 16], "attention_bias": True, "use_qk_norm": False,
                    "cla_share_factor": 3}, {}),
    # No CLA, no shared MLP, the experts as wide as intermediate_size; head_dim 32 so the
    # quantized KV-cache decode runs.
    "hunyuan-f32-nocla-noshared-hd32": (
        "hunyuan", {"use_cla": False, "use_mixed_mlp_moe": False, "moe_intermediate_size": None,
                    "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 2,
                    "rope_scaling": {"alpha": 50, "factor": 1.0, "type": "dynamic"}}, {}),
    # One expert: a dense MLP; HF's fused `qkv_proj` (GQA 2) and `gate_and_up_proj`, which
    # sanitize splits.
    "hunyuan-f32-dense-fused": (
        "hunyuan", {"num_experts": 1, "use_cla": False, "use_mixed_mlp_moe": False, "num_hidden_layers": 2},
        {"fused_hunyuan": True}),
    "hunyuan-q4": ("hunyuan", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "hunyuan-bf16-q4": ("hunyuan", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 32}}),
})
GOLDENS.update({
    "hunyuan-small-f32": ("hunyuan", dict(SMALL, moe_intermediate_size=16), {}),
})

# Baichuan-M1: layers 1 and 3 slide (window 4), keys and values convolved over two
# positions before RoPE; the HF checkpoint's lm_head is not normalized (sanitize does).
ARCHS["baichuan_m1"] = {"model_type": "baichuan_m1", "num_hidden_layers": 4, "rope_theta": 10000.0,
                        "sliding_window": 4, "sliding_window_layers": [1, 3], "conv_window": 2,
                        "tie_word_embeddings": False}
VARIANTS.update({
    "baichuan_m1-f32": ("baichuan_m1", {}, {}),
    # The masks come from the list's first entry (layer 2) and the first other layer
    # (1); the sliding layers have their own head counts (head_dim 32 there).
    "baichuan_m1-f32-swaheads-listorder": (
        "baichuan_m1", {"sliding_window_layers": [2, 0], "num_hidden_layers": 3,
                        "num_swa_attention_heads": 2, "num_swa_key_value_heads": 1}, {}),
    # Every layer global (head_dim 32: the quantized KV-cache decode), or every layer sliding.
    "baichuan_m1-f32-global-hd32": (
        "baichuan_m1", {"sliding_window_layers": [], "num_attention_heads": 2, "num_key_value_heads": 1,
                        "num_hidden_layers": 2}, {}),
    "baichuan_m1-f32-allswa": ("baichuan_m1", {"sliding_window_layers": [0, 1], "num_hidden_layers": 2}, {}),
    "baichuan_m1-bf16": ("baichuan_m1", {}, {"dtype": "bfloat16"}),
    "baichuan_m1-q4": ("baichuan_m1", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "baichuan_m1-bf16-q4": ("baichuan_m1", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    "baichuan_m1-small-f32": ("baichuan_m1", dict(SMALL), {}),
})


# Ling / Bailing MoE: layer 0 dense, then softmax top-2 of 8 experts beside a shared
# expert; HF's per-expert tensors and router `mlp.gate.weight` (sanitize stacks and
# renames them).
ARCHS["bailing_moe"] = {"model_type": "bailing_moe", "num_hidden_layers": 3, "num_experts": 8,
                        "num_shared_experts": 1, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                        "norm_topk_prob": True, "first_k_dense_replace": 1, "rope_theta": 10000.0,
                        "tie_word_embeddings": False}
VARIANTS.update({
    "bailing_moe-f32": ("bailing_moe", {}, {}),
    # Ling 2.0's switches: sigmoid scores with the expert bias, two groups of four (one
    # kept), per-head q/k norms, half the head rotated, biases everywhere, a wider shared
    # expert, routed scaling.
    "bailing_moe-f32-sigmoid-groups-bias-qknorm-partial": (
        "bailing_moe", {"score_function": "sigmoid", "moe_router_enable_expert_bias": True, "n_group": 2,
                        "topk_group": 1, "use_qk_norm": True, "partial_rotary_factor": 0.5, "use_bias": True,
                        "use_qkv_bias": True, "moe_shared_expert_intermediate_size": 48,
                        "routed_scaling_factor": 2.5}, {}),
    # Tied head, no shared expert (the router switch off), rotary_dim with YaRN,
    # unnormalized top-3, head_dim 32 (the quantized KV-cache decode), every layer routed.
    # (YaRN here: transformers, which the convert oracle's tokenizer loading goes through,
    # refuses it without max_position_embeddings in its config class.)
    "bailing_moe-f32-tied-noshared-rotarydim-hd32": (
        "bailing_moe", {"tie_word_embeddings": True, "moe_router_enable_shared_expert": False, "rotary_dim": 8,
                        "norm_topk_prob": False, "num_experts_per_tok": 3, "num_attention_heads": 2,
                        "num_key_value_heads": 1, "first_k_dense_replace": 0,
                        "rope_scaling": {"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 128}},
        {}),
    # norm_head: sanitize divides each column of the head by its norm at every load; no
    # shared experts by count. (Not top-1: mlx-lm's compiled aggregate_expert_outputs
    # crashes MLX 0.32.4 on a single expert per token.)
    "bailing_moe-f32-normhead-noshared": (
        "bailing_moe", {"norm_head": True, "num_shared_experts": 0}, {}),
    # num_experts null: every layer dense.
    "bailing_moe-f32-dense": ("bailing_moe", {"num_experts": None, "use_bias": True}, {}),
    "bailing_moe-q4": ("bailing_moe", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "bailing_moe-bf16-q4": (
        "bailing_moe", {"score_function": "sigmoid", "moe_router_enable_expert_bias": True, "n_group": 2,
                        "topk_group": 1}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 32}}),
})
GOLDENS.update({
    "bailing_moe-small-f32": ("bailing_moe", dict(SMALL, moe_intermediate_size=16), {}),
})

# GLM-5 (glm_moe_dsa): DeepSeek-V3.2 (indexer keeping 8 positions) read from GLM's
# config: rope_theta and rope_scaling come from `rope_parameters` (the top-level
# rope_theta here is ignored), the indexer's keys rotated interleaved by default.
ARCHS["glm_moe_dsa"] = dict(DEEPSEEK_V3, model_type="glm_moe_dsa", index_n_heads=4, index_head_dim=16,
                            index_topk=8, scoring_func="sigmoid", moe_layer_freq=1, attention_bias=False,
                            rope_theta=1000000.0, rope_parameters={"rope_theta": 10000.0, "rope_type": "default"})
VARIANTS.update({
    "glm_moe_dsa-f32-mtp": ("glm_moe_dsa", {}, {"mtp": True}),
    # YaRN with mscale_all_dim through rope_parameters (the attention scale too), the
    # indexer's keys not interleaved, one group, every other layer routed, biases.
    "glm_moe_dsa-f32-yarn-nointerleave-freq2": (
        "glm_moe_dsa", {"rope_parameters": dict(DS_YARN, rope_theta=10000.0), "indexer_rope_interleave": False,
                        "n_group": 1, "topk_group": 1, "moe_layer_freq": 2, "first_k_dense_replace": 0,
                        "attention_bias": True, "norm_topk_prob": False}, {}),
    "glm_moe_dsa-q4": ("glm_moe_dsa", {}, {"quant": {"bits": 4, "group_size": 32}}),
})
GOLDENS.update({
    "glm_moe_dsa-small-f32": ("glm_moe_dsa", dict(MLA_SMALL, index_n_heads=2, index_head_dim=16, index_topk=4),
                              {"mtp": True}),
})

# Solar Open: glm4_moe as it is, from a config that leaves out attention_bias,
# use_qk_norm, n_group and topk_group (their defaults: off, one group).
ARCHS["solar_open"] = {k: v for k, v in ARCHS["glm4_moe"].items()
                       if k not in ("n_group", "topk_group", "use_qk_norm", "attention_bias", "rope_scaling")}
ARCHS["solar_open"]["model_type"] = "solar_open"
VARIANTS.update({
    "solar_open-f32-mtp": ("solar_open", {}, {"mtp": True}),
    "solar_open-f32-groups-qknorm-bias": (
        "solar_open", {"n_group": 2, "topk_group": 1, "use_qk_norm": True, "attention_bias": True,
                       "norm_topk_prob": False, "partial_rotary_factor": 1.0}, {}),
    "solar_open-q4": ("solar_open", {}, {"quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    "solar_open-small-f32": ("solar_open", dict(SMALL, head_dim=8, moe_intermediate_size=16), {"mtp": True}),
})

# Apertus: attention without biases, q/k norms always; a gateless MLP through XieLU (its
# four scalars per layer; HF keeps alpha_p / alpha_n as one-element tensors, which
# sanitize squeezes). attention_bias / qk_norm / post_norm are required but not read.
ARCHS["apertus"] = {"model_type": "apertus", "mlp_bias": False, "attention_bias": False, "rope_theta": 12000000.0,
                    "post_norm": False, "qk_norm": True, "tie_word_embeddings": False}
VARIANTS.update({
    "apertus-f32": ("apertus", {}, {}),
    # Tied (HF's redundant lm_head dropped by sanitize), MLP biases, Llama 3 RoPE
    # scaling, traditional rotation, head_dim 32 (the quantized KV-cache decode).
    "apertus-f32-tied-mlpbias-llama3-traditional-hd32": (
        "apertus", {"tie_word_embeddings": True, "mlp_bias": True, "rope_traditional": True,
                    "num_attention_heads": 2, "num_key_value_heads": 1,
                    "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                     "original_max_position_embeddings": 32, "rope_type": "llama3"}},
        {"lm_head": True}),
    "apertus-q4": ("apertus", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "apertus-bf16-q4": ("apertus", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    "apertus-small-f32": ("apertus", dict(SMALL), {}),
})

# Qwen (v1): HF's names (transformer.wte / h / ln_f), one biased c_attn split in three,
# a SwiGLU MLP half intermediate_size wide (w2 the gate), an untied head; `no_bias`
# (default true) drops the biases of c_proj, the MLP and lm_head. num_key_value_heads is
# not a config key in mlx-lm (BASE's is ignored).
ARCHS["qwen"] = {"model_type": "qwen", "kv_channels": 16, "layer_norm_epsilon": 1e-6, "no_bias": True}
VARIANTS.update({
    "qwen-f32": ("qwen", {}, {}),
    "qwen-f32-bias": ("qwen", {"no_bias": False}, {}),
    "qwen-q4": ("qwen", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "qwen-bf16-q4": ("qwen", {"no_bias": False}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    "qwen-small-f32": ("qwen", dict(SMALL, kv_channels=8, no_bias=False), {}),
})

# GPT-J: HF's names (transformer.*), parallel attention and MLP over one LayerNorm,
# traditional RoPE over the first rotary_dim dimensions of each head.
ARCHS["gptj"] = {"model_type": "gptj", "n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 256,
                 "rotary_dim": 8, "layer_norm_epsilon": 1e-5}
VARIANTS.update({
    "gptj-f32": ("gptj", {}, {}),
    # rotary_dim null: the whole head rotates (mlx-lm's `rotary_dim or head_dim`); head
    # size 32 so the 8-bit KV-cache decode runs too.
    "gptj-f32-fullrotary-hd32": ("gptj", {"rotary_dim": None, "n_head": 2}, {}),
    "gptj-q4": ("gptj", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "gptj-bf16-q4": ("gptj", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    "gptj-small-f32": ("gptj", dict(SMALL, n_embd=32, n_positions=64, rotary_dim=4), {}),
})

# GLM: traditional RoPE over head_dim, q/k/v biases by attention_bias, fused gate_up_proj.
ARCHS["glm"] = {"model_type": "glm", "head_dim": 16, "rope_theta": 10000.0, "attention_bias": False,
                "tie_word_embeddings": True}
VARIANTS.update({
    # Tied, with HF's rotary buffers and redundant lm_head (sanitize drops them).
    "glm-f32": ("glm", {}, {"extras": True}),
    "glm-f32-untied-bias-hd32": ("glm", {"tie_word_embeddings": False, "attention_bias": True, "head_dim": 32,
                                         "num_attention_heads": 2, "num_key_value_heads": 1,
                                         "rope_theta": 50000.0}, {}),
    # head_dim null: hidden_size / num_attention_heads (mlx-lm's `head_dim or ...`).
    "glm-f32-nullhd": ("glm", {"head_dim": None}, {}),
    "glm-q4": ("glm", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "glm-bf16-q4": ("glm", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    "glm-small-f32": ("glm", dict(SMALL, head_dim=8), {}),
})

# OpenELM: per-layer head counts and FFN widths (make_divisible of ffn_multipliers[i] *
# model_dim), a fused qkv_proj split by heads, per-head q/k norms, fused proj_1.
ARCHS["openelm"] = {"model_type": "openelm", "head_dim": 16, "num_transformer_layers": 3, "model_dim": 64,
                    "ffn_dim_divisor": 16, "num_query_heads": [2, 4, 4], "num_kv_heads": [1, 2, 4],
                    "ffn_multipliers": [0.5, 1.3, 2.0], "normalize_qk_projections": True,
                    "share_input_output_layers": True, "rms_norm_eps": 1e-6, "rope_freq_constant": 10000}
VARIANTS.update({
    "openelm-f32": ("openelm", {}, {}),
    "openelm-f32-untied-nonorm-hd32": ("openelm", {"share_input_output_layers": False,
                                                   "normalize_qk_projections": False, "head_dim": 32,
                                                   "rope_freq_constant": 50000.0}, {}),
    "openelm-q4": ("openelm", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "openelm-bf16-q4": ("openelm", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    "openelm-small-f32": ("openelm", dict(SMALL, model_dim=32, head_dim=8, ffn_dim_divisor=8), {}),
})

# nanochat: parameter-free RMS norms, RoPE with negated frequencies, the rotated q/k
# normed, a relu2 MLP (c_fc / c_proj), logits soft-capped at 15; every key defaulted.
ARCHS["nanochat"] = {"model_type": "nanochat", "rope_theta": 10000.0}
VARIANTS.update({
    "nanochat-f32": ("nanochat", {}, {}),
    # Two heads of 32 without grouping (the 8-bit KV-cache decode runs too), theta 50000.
    "nanochat-f32-mha-hd32": ("nanochat", {"num_attention_heads": 2, "num_key_value_heads": 2,
                                           "rope_theta": 50000.0}, {}),
    "nanochat-q4": ("nanochat", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "nanochat-bf16-q4": ("nanochat", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    "nanochat-small-f32": ("nanochat", dict(SMALL), {}),
})

# Mistral 4: DeepSeek-V3's latent attention rotated from `rope_parameters` (YaRN with
# mscale_all_dim, so the attention scale too; interleaved unless rope_interleave is
# false), Llama 4's query scale (original_max_position_embeddings 8, so prompts of 13
# and 40 tokens cross it), a linear softmax router with group limiting and
# renormalization, shared experts, the first layer dense. HF's experts fused
# (gate_up_proj [E, 2I, D], down_proj [E, D, I]) unless `per_expert`.
MISTRAL4_ROPE = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
                 "llama_4_scaling_beta": 0.1, "rope_theta": 10000.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                 "beta_fast": 32.0, "beta_slow": 1.0}
ARCHS["mistral4"] = dict(DEEPSEEK_V3, model_type="mistral4", rope_parameters=MISTRAL4_ROPE, tie_word_embeddings=False)
del ARCHS["mistral4"]["topk_method"], ARCHS["mistral4"]["rope_theta"]
VARIANTS.update({
    "mistral4-f32": ("mistral4", {}, {}),
    # Tied; no q LoRA; the default rotation (its mscale_all_dim not applied, theta
    # 100000 when rope_parameters has none; the top-level rope_theta / rope_scaling
    # ignored), not interleaved; attention biases; no groups, no renormalization, no
    # shared experts, every layer routed; per-expert HF weights.
    "mistral4-f32-tied-noqlora-default-nointerleave": (
        "mistral4", {"tie_word_embeddings": True, "q_lora_rank": None, "rope_interleave": False,
                     "rope_parameters": {"rope_type": "default", "factor": 4.0, "mscale_all_dim": 1.0,
                                         "llama_4_scaling_beta": 0.2, "original_max_position_embeddings": 16},
                     "rope_theta": 5.0, "rope_scaling": DS_YARN, "attention_bias": True, "n_group": 1,
                     "topk_group": 1, "norm_topk_prob": False, "n_shared_experts": None,
                     "first_k_dense_replace": 0}, {"per_expert": True}),
    "mistral4-q4": ("mistral4", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "mistral4-bf16-q4-kvb": ("mistral4", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 32},
                                              "kv_b_quantized": True}),
    # FP8: per-tensor scales, per-expert ones for the fused experts, 128x128 blocks for
    # kv_b_proj, activation scales (dropped).
    "mistral4-fp8": ("mistral4", {}, {"fp8_mistral4": True}),
    # Mistral 3's config around a dense Mistral 4 text model (no routed experts).
    "mistral3-f32-mistral4": ("mistral4", {"n_routed_experts": None, "n_shared_experts": None},
                              {"wrap_mistral3": "new"}),
})
GOLDENS.update({
    "mistral4-small-f32": ("mistral4", dict(MLA_SMALL), {}),
})

# DeepSeek-MoE v1 (deepseek): Llama-shaped attention (biased by attention_bias, linear
# RoPE scaling only for `type: linear`), softmax top-k experts without normalization or
# scaling plus shared experts, from first_k_dense_replace on every moe_layer_freq-th
# layer; HF's per-expert weights.
ARCHS["deepseek"] = {"model_type": "deepseek", "n_routed_experts": 8, "n_shared_experts": 1,
                     "num_experts_per_tok": 2, "moe_intermediate_size": 32, "first_k_dense_replace": 1,
                     "num_hidden_layers": 3, "rope_theta": 10000.0, "rms_norm_eps": 1e-6}
VARIANTS.update({
    "deepseek-f32": ("deepseek", {}, {}),
    # Head dim 32 (the quantized KV-cache decode too), no GQA.
    "deepseek-f32-linear-bias-freq2-noshared-hd32": (
        "deepseek", {"rope_scaling": {"type": "linear", "factor": 2.0}, "attention_bias": True,
                     "moe_layer_freq": 2, "first_k_dense_replace": 0, "n_shared_experts": None,
                     "num_attention_heads": 2, "num_key_value_heads": 2}, {}),
    # No routed experts (every layer dense); a non-linear rope_scaling type, ignored.
    "deepseek-f32-dense-dynamic": (
        "deepseek", {"n_routed_experts": None, "rope_scaling": {"type": "dynamic", "factor": 2.0}}, {}),
    "deepseek-q4": ("deepseek", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "deepseek-bf16-q4": ("deepseek", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 32}}),
})
GOLDENS.update({
    "deepseek-small-f32": ("deepseek", dict(SMALL, moe_intermediate_size=16), {}),
})

# DBRX: fused Wqkv clipped to clip_qkv (1.0 clips the tiny model's projections), bias-free
# layer norms, softmax top-k over separate gated experts (L1-renormalized scores), run
# token by token as mlx-lm does; HF's experts fused per layer as `experts.mlp.{w1, v1,
# w2}` ([E * ffn, d_model], w2's parts transposed).
DBRX_ATTN = {"kv_n_heads": 2, "clip_qkv": 1.0, "rope_theta": 10000.0}
DBRX_FFN = {"ffn_hidden_size": 64, "moe_num_experts": 4, "moe_top_k": 2}
ARCHS["dbrx"] = {"model_type": "dbrx", "d_model": 64, "n_layers": 2, "n_heads": 4,
                 "attn_config": DBRX_ATTN, "ffn_config": DBRX_FFN}
VARIANTS.update({
    "dbrx-f32": ("dbrx", {}, {}),
    # Head dim 32 (the quantized KV-cache decode too), no GQA, one expert per token, an
    # integer clip that never binds, another theta.
    "dbrx-f32-mha-top1-hd32": (
        "dbrx", {"n_heads": 2, "attn_config": {"kv_n_heads": 2, "clip_qkv": 8, "rope_theta": 500000.0},
                 "ffn_config": dict(DBRX_FFN, moe_top_k=1)}, {}),
    "dbrx-q4": ("dbrx", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "dbrx-bf16-q4": ("dbrx", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    "dbrx-small-f32": ("dbrx", {"d_model": 32, "ffn_config": dict(DBRX_FFN, ffn_hidden_size=32)}, {}),
})

# Phixtral: Phi-2 layers with parallel attention (one biased Wqkv, partial RoPE, float32
# queries) and SwitchMLP experts (biased fc1 / fc2, GELU) over one LayerNorm, softmax over
# the top-k router logits; a LayerNorm + linear head. HF's experts per expert as
# `moe.mlp.{e}.{fc1, fc2}` (sanitize stacks them, biases too).
ARCHS["phixtral"] = {"model_type": "phixtral", "num_vocab": 128, "model_dim": 64, "num_heads": 4,
                     "num_layers": 2, "rotary_dim": 8, "num_experts_per_tok": 2, "num_local_experts": 4}
VARIANTS.update({
    "phixtral-f32": ("phixtral", {}, {}),
    # Head size 32 (the quantized KV-cache decode too), the whole head rotated, one
    # expert per token.
    "phixtral-f32-top1-fullrotary-hd32": (
        "phixtral", {"num_heads": 2, "rotary_dim": 32, "num_experts_per_tok": 1, "num_local_experts": 3}, {}),
    "phixtral-q4": ("phixtral", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "phixtral-bf16-q4": ("phixtral", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    "phixtral-small-f32": ("phixtral", {"model_dim": 32, "rotary_dim": 4}, {}),
})

# TeleChat3: Llama-shaped; all four attention projections biased by attention_bias,
# the MLP's by mlp_bias, RoPE through initialize_rope (never traditional), untied by
# default; no sanitize (the checkpoint loads as it is).
ARCHS["telechat3"] = {"model_type": "telechat3", "rope_theta": 10000.0}
VARIANTS.update({
    "telechat3-f32": ("telechat3", {}, {}),
    # Tied, both biases, Llama 3 RoPE scaling, head_dim 32 (the quantized KV-cache decode).
    "telechat3-f32-tied-bias-llama3-hd32": (
        "telechat3", {"tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True,
                      "num_attention_heads": 2, "num_key_value_heads": 1, "rope_theta": 50000.0,
                      "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                       "original_max_position_embeddings": 32, "rope_type": "llama3"}}, {}),
    # An explicit head_dim other than hidden_size / heads, linear RoPE scaling.
    "telechat3-f32-hd8-linear": ("telechat3", {"head_dim": 8, "rope_scaling": {"type": "linear", "factor": 2.0}}, {}),
    "telechat3-q4": ("telechat3", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "telechat3-bf16-q4": ("telechat3", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    "telechat3-small-f32": ("telechat3", dict(SMALL), {}),
})

# Nanbeige: Llama-shaped (all four attention projections biased by attention_bias, the
# MLP's by mlp_bias, initialize_rope), the layer stack run num_loops times with shared
# weights (len(loop_loss_weights) + 1 where that list is non-empty), each run with its
# own caches and the final norm after it unless skip_loop_final_norm; sanitize drops
# HF's rotary buffers.
ARCHS["nanbeige"] = {"model_type": "nanbeige", "num_loops": 2, "tie_word_embeddings": False}
VARIANTS.update({
    "nanbeige-f32": ("nanbeige", {}, {"extras": True}),
    # Three runs from two loss weights (num_loops ignored), the norm once at the end,
    # tied, both biases, Llama 3 RoPE scaling, head_dim 32 (the quantized KV-cache decode).
    "nanbeige-f32-lossweights-skipnorm-tied-bias-llama3-hd32": (
        "nanbeige", {"loop_loss_weights": [0.5, 0.25], "skip_loop_final_norm": True,
                     "tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True,
                     "num_attention_heads": 2, "num_key_value_heads": 1, "rope_theta": 50000.0,
                     "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                      "original_max_position_embeddings": 32, "rope_type": "llama3"}}, {}),
    # One run (the default), an explicit head_dim, linear RoPE scaling, an empty
    # loop_loss_weights (num_loops read).
    "nanbeige-f32-oneloop-hd8-linear": (
        "nanbeige", {"num_loops": 1, "loop_loss_weights": [], "head_dim": 8,
                     "rope_scaling": {"type": "linear", "factor": 2.0}}, {}),
    "nanbeige-q4": ("nanbeige", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "nanbeige-bf16-q4": ("nanbeige", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    "nanbeige-small-f32": ("nanbeige", dict(SMALL), {}),
})

# Lille 130M: its own key names (n_embd, n_head, ...), q/k/v from one bias-free qkv_proj,
# traditional RoPE, each block's pre-norm inside it (attention.norm, feed_forward.norm),
# a SwiGLU MLP 256 * round(int(8 * n_embd / 3) / 256) wide (so n_embd >= 56 for a
# nonzero one), the head always the embedding; sanitize drops rotary_emb buffers.
ARCHS["lille-130m"] = {"model_type": "lille-130m", "block_size": 256, "layer_norm_eps": 1e-5, "n_embd": 64,
                       "n_head": 4, "n_kv_heads": 2, "n_layer": 2, "rope_theta": 10000.0}
VARIANTS.update({
    # GQA 4/2 over head size 16, with HF's rotary buffers.
    "lille-130m-f32": ("lille-130m", {}, {"extras": True}),
    # MHA over head size 32 (the quantized KV-cache decode), another theta; mlx-lm ignores
    # tie_word_embeddings (the head stays the embedding).
    "lille-130m-f32-mha-hd32-untiedflag": (
        "lille-130m", {"n_head": 2, "n_kv_heads": 2, "rope_theta": 50000.0, "tie_word_embeddings": False}, {}),
    # 144 wide: int(384) / 256 = 1.5 rounds to 2 (a 512-wide MLP); 10 heads of 14 that
    # do not fill the width (out_proj reads 140).
    "lille-130m-f32-w144-h10": ("lille-130m", {"n_embd": 144, "n_head": 10, "n_kv_heads": 5}, {}),
    "lille-130m-q4": ("lille-130m", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "lille-130m-bf16-q4": ("lille-130m", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    # The narrowest nonzero MLP is 256 wide: one layer keeps the golden small.
    "lille-130m-small-f32": ("lille-130m", {"n_layer": 1}, {}),
})

# Pixtral and LFM2-VL: a Llama / LFM2 text model under `language_model` (its config in
# text_config), the top-level vision_tower and multi_modal_projector trees beside it that
# sanitize drops (wrap_towers). mlx-lm calls neither text model's sanitize, so the text
# weights are written as mlx-lm names them (no HF rotary buffers, LFM2's convolution
# weights [C, K, 1]); Pixtral's head is always untied, whatever text_config says.
VARIANTS.update({
    # A Mistral text config that says tied: the head is still its own lm_head.
    "pixtral-f32": ("llama", {"model_type": "mistral"}, {"wrap_towers": ("pixtral", {"tie_word_embeddings": True})}),
    # No num_attention_heads in text_config (32 heads of head_dim 8 over 8 kv heads),
    # llama3 RoPE, biases.
    "pixtral-f32-defaultheads-llama3-bias": (
        "llama", {"num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 8, "rope_scaling": LLAMA3,
                  "attention_bias": True, "mlp_bias": True},
        {"wrap_towers": ("pixtral", {"num_attention_heads": None})}),
    # Head size 32 (the quantized KV-cache decode), traditional RoPE.
    "pixtral-f32-hd32-traditional": (
        "llama", {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "rope_traditional": True},
        {"wrap_towers": ("pixtral", {})}),
    "pixtral-q4": ("llama", {}, {"wrap_towers": ("pixtral", {}), "quant": {"bits": 4, "group_size": 32}}),
    "pixtral-bf16-q4": ("llama", {}, {"wrap_towers": ("pixtral", {}), "dtype": "bfloat16",
                                      "quant": {"bits": 4, "group_size": 64}}),
    # LFM2's convolution and attention layers; its own caches (make_cache).
    "lfm2-vl-f32": ("lfm2", {}, {"wrap_towers": ("lfm2-vl", {})}),
    "lfm2-vl-f32-bias-layer-types": (
        "lfm2", {"conv_bias": True, "full_attn_idxs": None, "block_ff_dim": None, "intermediate_size": 96,
                 "block_auto_adjust_ff_dim": False, "layer_types": ["full_attention", "conv", "conv", "full_attention"],
                 "num_attention_heads": 2, "num_key_value_heads": 1},
        {"wrap_towers": ("lfm2-vl", {})}),
    "lfm2-vl-q4": ("lfm2", {}, {"wrap_towers": ("lfm2-vl", {}), "quant": {"bits": 4, "group_size": 64}}),
    "lfm2-vl-bf16-q4": ("lfm2", {}, {"wrap_towers": ("lfm2-vl", {}), "dtype": "bfloat16",
                                     "quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    "pixtral-small-f32": ("llama", dict(SMALL, model_type="mistral"), {"wrap_towers": ("pixtral", {})}),
    "lfm2-vl-small-f32": ("lfm2", dict(SMALL, block_dim=32, block_ff_dim=64, block_multiple_of=16),
                          {"wrap_towers": ("lfm2-vl", {})}),
})


# Kimi-VL: DeepSeek-V3's text model (kimi_vl's TextArgs: the same keys and defaults)
# under `language_model`. Its sanitize drops every key containing vision_tower,
# rotary_emb or multi_modal_projector and stacks the experts, nothing else: MLA's
# `embed_q` / `unembed_out` stay as mlx-lm names them (mlx-lm's kimi_vl cannot load a
# `kv_b_proj`).
VARIANTS.update({
    "kimi_vl-f32": ("deepseek_v3", {}, {"wrap_kimi_vl": True}),
    # No q LoRA, yarn RoPE, attention biases, MoE every other layer, two shared experts.
    "kimi_vl-f32-noqlora-yarn-bias-freq2": (
        "deepseek_v3", {"q_lora_rank": None, "attention_bias": True, "rope_scaling": DS_YARN, "n_group": 1,
                        "topk_group": 1, "norm_topk_prob": False, "moe_layer_freq": 2, "first_k_dense_replace": 0,
                        "n_shared_experts": 2}, {"wrap_kimi_vl": True}),
    # No routed experts: every layer dense (nothing to stack).
    "kimi_vl-f32-dense": ("deepseek_v3", {"n_routed_experts": None, "n_shared_experts": None},
                          {"wrap_kimi_vl": True}),
    "kimi_vl-q4": ("deepseek_v3", {}, {"wrap_kimi_vl": True, "quant": {"bits": 4, "group_size": 32}}),
    "kimi_vl-bf16-q4": ("deepseek_v3", {}, {"wrap_kimi_vl": True, "dtype": "bfloat16",
                                            "quant": {"bits": 4, "group_size": 32}}),
})
GOLDENS.update({
    "kimi_vl-small-f32": ("deepseek_v3", MLA_SMALL, {"wrap_kimi_vl": True}),
})


# Nemotron-NAS: each layer's attention and FFN shaped by its block_configs entry: full
# (GQA of n_heads_in_group query heads per kv head; a gated MLP int(2 * ffn_mult * 64 / 3)
# rounded up to 256 wide), a dim x dim linear layer (replace_with_linear) or absent
# (no_op, its norm too). Every layer with an attention block has a cache, a linear one
# too (never updated), the mask made from the first.
def nas_block(attn, ffn):
    a = {"no_op": {"no_op": True}, "linear": {"replace_with_linear": True}}.get(attn)
    f = {"no_op": {"no_op": True}, "linear": {"replace_with_linear": True}}.get(ffn)
    return {"attention": a or {"n_heads_in_group": attn, "no_op": False, "replace_with_linear": False,
                               "sparsify": None, "window_length": None, "num_sink_tokens": None,
                               "use_prefill_window_in_sink_attention": False, "unshifted_sink": False},
            "ffn": f or {"ffn_mult": ffn, "no_op": False, "replace_with_linear": False, "sparsify": None}}


ARCHS["nemotron-nas"] = {
    "model_type": "nemotron-nas", "num_hidden_layers": 4, "rope_theta": 500000.0, "hidden_act": "silu",
    "max_position_embeddings": 256, "tie_word_embeddings": False,
    # full GQA 4/2 + MLP 256 wide; no attention + MLP; linear + linear; GQA 4/1 + no FFN.
    "block_configs": [nas_block(2, 1.0), nas_block("no_op", 0.5), nas_block("linear", "linear"),
                      nas_block(4, "no_op")],
}
VARIANTS.update({
    "nemotron-nas-f32": ("nemotron-nas", {}, {}),
    # The first cache belongs to a linear attention layer; biases, relu, llama3 RoPE, tied,
    # head size 32 (the quantized KV-cache decode); ffn_mult 3.2 -> int(136.53) -> 256.
    "nemotron-nas-f32-linearfirst-bias-relu-llama3-tied-hd32": (
        "nemotron-nas", {"num_attention_heads": 2, "attention_bias": True, "mlp_bias": True, "hidden_act": "relu",
                         "rope_scaling": LLAMA3, "tie_word_embeddings": True,
                         "block_configs": [nas_block("linear", 3.2), nas_block(1, "no_op"),
                                           nas_block("no_op", "linear"), nas_block(2, 1.3)]}, {}),
    # gelu_new (gelu_approx) over an ffn_mult past 256: 12.0 -> 512 wide; 3 layers.
    "nemotron-nas-f32-gelunew-wide": (
        "nemotron-nas", {"hidden_act": "gelu_new", "num_hidden_layers": 3,
                         "block_configs": [nas_block(1, 12.0), nas_block(2, "linear"), nas_block(4, 1.0)]}, {}),
    # Exact gelu, every layer full.
    "nemotron-nas-f32-gelu": (
        "nemotron-nas", {"hidden_act": "gelu", "num_hidden_layers": 2,
                         "block_configs": [nas_block(2, 1.0), nas_block(2, 1.0)]}, {}),
    "nemotron-nas-q4": ("nemotron-nas", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "nemotron-nas-bf16-q4": ("nemotron-nas", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    # A full first layer (batched prompts' masks come from its cache), then no attention
    # and a linear FFN. Not a linear attention: its cache, never written, makes mlx-lm's
    # batch_generate raise (BatchKVCache.extract of no keys).
    "nemotron-nas-small-f32": ("nemotron-nas", dict(SMALL, num_hidden_layers=2,
                                                    block_configs=[nas_block(2, 1.0), nas_block("no_op", "linear")]),
                               {}),
})


# Youtu-LLM: DeepSeek-V2's low-rank queries and compressed keys / values expanded by
# kv_b_proj (rotary part repeated over the heads), norms at rms_norm_eps, initialize_rope
# over qk_rope_head_dim (traditional by default), dense SwiGLU MLPs; tied by default.
ARCHS["youtu_llm"] = {"model_type": "youtu_llm", "num_attention_heads": 4, "num_key_value_heads": 4,
                      "q_lora_rank": 32, "kv_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
                      "v_head_dim": 16, "rope_theta": 1600000.0, "max_position_embeddings": 256}
VARIANTS.update({
    "youtu_llm-f32": ("youtu_llm", {}, {}),
    # No q LoRA, untied, biases, llama3 RoPE not traditional; query / key heads of 24 + 8
    # and values of 32 (the quantized KV-cache decode).
    "youtu_llm-f32-noqlora-untied-bias-llama3-hd32": (
        "youtu_llm", {"q_lora_rank": None, "tie_word_embeddings": False, "attention_bias": True, "mlp_bias": True,
                      "rope_scaling": LLAMA3, "rope_traditional": False, "qk_nope_head_dim": 24, "v_head_dim": 32},
        {}),
    "youtu_llm-f32-yarn": ("youtu_llm", {"rope_scaling": YARN}, {}),
    "youtu_llm-q4": ("youtu_llm", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "youtu_llm-bf16-q4": ("youtu_llm", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 32}}),
})
GOLDENS.update({
    "youtu_llm-small-f32": ("youtu_llm", dict(SMALL, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16,
                                              qk_nope_head_dim=8, v_head_dim=8), {}),
})


# Klear: Qwen3-shaped attention (per-head q/k norms, heads of hidden / heads, biases by
# attention_bias), experts on the layers (i + 1) % decoder_sparse_step == 0 outside
# mlp_only_layers: sigmoid scores plus expert_bias pick them, the shared experts mixed
# in by softmax(coefficient(x)); HF's per-expert weights, which sanitize stacks.
ARCHS["Klear"] = {"model_type": "Klear", "num_hidden_layers": 3, "attention_bias": False, "mlp_only_layers": [0],
                  "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1, "n_shared_experts": 1,
                  "moe_intermediate_size": 32, "rope_theta": 10000.0, "max_position_embeddings": 256,
                  "norm_topk_prob": True}
VARIANTS.update({
    "Klear-f32": ("Klear", {}, {}),
    # Every second layer sparse (layers 1 and 3), none excluded; biases, raw top-k scores,
    # two shared experts, heads of 32 (the quantized KV-cache decode).
    "Klear-f32-step2-bias-nonorm-hd32": (
        "Klear", {"num_hidden_layers": 4, "mlp_only_layers": [], "decoder_sparse_step": 2, "attention_bias": True,
                  "norm_topk_prob": False, "n_shared_experts": 2, "num_attention_heads": 2,
                  "num_key_value_heads": 1}, {}),
    # No experts at all: every layer dense (decoder_sparse_step never read).
    "Klear-f32-dense": ("Klear", {"num_experts": 0, "decoder_sparse_step": 0}, {}),
    "Klear-q4": ("Klear", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "Klear-bf16-q4": ("Klear", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 32}}),
})
GOLDENS.update({
    "Klear-small-f32": ("Klear", dict(SMALL, num_hidden_layers=2, moe_intermediate_size=16), {}),
})


# Mellum: Qwen3-shaped attention whose RoPE each layer type takes from
# rope_parameters[type] (default / linear: plain, whatever else the section says),
# sliding layers with a rotating cache of 4 (prompts cross it), Qwen3-MoE's softmax
# experts in every layer (HF's per-expert weights, stacked by sanitize).
MELLUM_ROPE = {"full_attention": {"rope_theta": 1000000.0, "rope_type": "default"},
               "sliding_attention": {"rope_theta": 10000.0}}
ARCHS["mellum"] = {"model_type": "mellum", "num_hidden_layers": 3, "head_dim": 16, "num_experts": 4,
                   "num_experts_per_tok": 2, "moe_intermediate_size": 32, "tie_word_embeddings": False,
                   "max_position_embeddings": 256, "norm_topk_prob": True, "sliding_window": 4,
                   "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
                   "rope_parameters": MELLUM_ROPE}
VARIANTS.update({
    "mellum-f32": ("mellum", {}, {}),
    # yarn on the global layers, linear (so plain) on the sliding ones; tied, raw top-k
    # scores, heads of 32 (the quantized KV-cache decode), the global layer first.
    "mellum-f32-yarn-linear-tied-nonorm-hd32": (
        "mellum", {"tie_word_embeddings": True, "norm_topk_prob": False, "head_dim": 32, "num_attention_heads": 2,
                   "num_key_value_heads": 1,
                   "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
                   "rope_parameters": {
                       "full_attention": {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                                          "original_max_position_embeddings": 64},
                       "sliding_attention": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}}}, {}),
    # Global layers only (no windowed mask), llama3 RoPE.
    "mellum-f32-full-llama3": (
        "mellum", {"num_hidden_layers": 2, "layer_types": ["full_attention"] * 2,
                   "rope_parameters": {"full_attention": dict(LLAMA3, rope_theta=500000.0)}}, {}),
    "mellum-q4": ("mellum", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "mellum-bf16-q4": ("mellum", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 32}}),
})
GOLDENS.update({
    "mellum-small-f32": ("mellum", dict(SMALL, head_dim=8, moe_intermediate_size=16,
                                        layer_types=["sliding_attention", "full_attention"], num_hidden_layers=2),
                         {}),
})


# Talkie: weightless RMS norms, RoPE with negated frequencies, queries and keys normed
# after it and the queries scaled per head, gains on every residual branch and a skip
# from the normed embeddings, a bare lm_head parameter times a gain.
ARCHS["talkie"] = {"model_type": "talkie", "num_attention_heads": 4, "head_dim": 16, "rope_theta": 1000000.0,
                   "max_position_embeddings": 256, "rms_norm_eps": 1.1920928955078125e-07}
VARIANTS.update({
    # With rotary buffers that sanitize drops; float32's epsilon (mlx-lm's default).
    "talkie-f32": ("talkie", {}, {"extras": True}),
    # Heads of 32 (the quantized KV-cache decode), another theta and eps, wider heads than
    # the width (4 x 32 = 128 over 64).
    "talkie-f32-hd32-eps": ("talkie", {"num_attention_heads": 4, "head_dim": 32, "rope_theta": 10000.0,
                                       "rms_norm_eps": 1e-5}, {}),
    "talkie-q4": ("talkie", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "talkie-bf16-q4": ("talkie", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    "talkie-small-f32": ("talkie", dict(SMALL, head_dim=8), {}),
})


# PLaMo: parallel layers over one pre-norm (model.layers.layers), key-value heads
# ceil(heads / n_shared_head) tiled (not repeated) over the query heads after the cache.
ARCHS["plamo"] = {"model_type": "plamo", "n_shared_head": 2, "rope_theta": 10000.0}
VARIANTS.update({
    # 4 query heads over 2 tiled key heads (head i reads key head i % 2).
    "plamo-f32": ("plamo", {}, {}),
    # One key head for 4, traditional RoPE at another theta.
    "plamo-f32-shared4-traditional": ("plamo", {"n_shared_head": 4, "rope_traditional": True,
                                                "rope_theta": 50000.0}, {}),
    # mlx-lm's default n_shared_head (8) over 8 heads of 8.
    "plamo-f32-h8-defaultshared": ("plamo", {"num_attention_heads": 8}, {"drop_keys": ["n_shared_head"]}),
    "plamo-q4": ("plamo", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "plamo-bf16-q4": ("plamo", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    "plamo-small-f32": ("plamo", dict(SMALL), {}),
})


# IQuest-Loop-Coder: the layers run twice; the second run mixes attention over the
# first run's keys (global) with its own in a rotating window, per head by a sigmoid
# gate. A window of 4 that the prompts cross.
ARCHS["iquestloopcoder"] = {"model_type": "iquestloopcoder", "head_dim": 16, "rope_theta": 500000.0,
                            "loop_window_size": 4, "tie_word_embeddings": False}
VARIANTS.update({
    "iquestloopcoder-f32": ("iquestloopcoder", {}, {}),
    # Biases, tied, llama3 RoPE, a window of 8, heads of 32 (MHA 2/2).
    "iquestloopcoder-f32-bias-tied-llama3-hd32": (
        "iquestloopcoder", {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True,
                            "rope_scaling": LLAMA3, "loop_window_size": 8, "num_attention_heads": 2,
                            "num_key_value_heads": 2, "head_dim": 32}, {}),
    "iquestloopcoder-q4": ("iquestloopcoder", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "iquestloopcoder-bf16-q4": ("iquestloopcoder", {}, {"dtype": "bfloat16",
                                                        "quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    "iquestloopcoder-small-f32": ("iquestloopcoder", dict(SMALL, head_dim=8), {}),
})


# PLaMo 3: sandwich norms applied as rms_norm(x, weight + offset) (post-norms offset
# 1/5 and 1/5^1.5), one qkv_proj with q/k norms, sliding layers (RotatingKVCache of
# window_size, masked with window_size + 1) and a full one every sliding_window_pattern
# layers at its own RoPE base, one gate_up_proj, a tied head by default.
ARCHS["plamo3"] = {"model_type": "plamo3", "head_dim": 16, "window_size": 4, "sliding_window_pattern": 2,
                   "rope_theta": 1000000.0, "rope_local_theta": 10000.0, "tie_word_embeddings": True}
VARIANTS.update({
    # A sliding layer (window 4, the prompts cross it) then a full one; tied head.
    "plamo3-f32": ("plamo3", {}, {}),
    # sliding_window (3) replacing window_size, two sliding layers before the full one,
    # an untied lm_head, head_dim 32.
    "plamo3-f32-untied-slidingwindow-hd32": ("plamo3", {
        "tie_word_embeddings": False, "sliding_window": 3, "window_size": 100, "num_hidden_layers": 3,
        "sliding_window_pattern": 3, "head_dim": 32, "rope_local_theta": 500.0}, {}),
    # Every layer full (pattern 1): plain KV caches, so the quantized-KV decode runs.
    "plamo3-f32-allfull-hd32": ("plamo3", {"sliding_window_pattern": 1, "head_dim": 32}, {}),
    # mlx-lm's defaults for the window (2048) and the pattern (8): no full layer at all.
    "plamo3-f32-defaults": ("plamo3", {}, {"drop_keys": ["window_size", "sliding_window_pattern",
                                                          "rope_theta", "rope_local_theta",
                                                          "tie_word_embeddings"]}),
    "plamo3-q4": ("plamo3", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "plamo3-bf16-q4": ("plamo3", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    "plamo3-small-f32": ("plamo3", dict(SMALL, head_dim=8, tie_word_embeddings=False), {}),
})


# Muse Glimmer: weightless-normed embeddings, Gemma (1 + weight) sandwich norms, weightless
# q/k norms (queries times qk_scale_factor), RoPE only where layer_rope_theta is nonzero
# (default: the sliding layers), a sigmoid output gate, soft-capped scaled logits.
ARCHS["muse_glimmer"] = {"model_type": "muse_glimmer", "num_hidden_layers": 4, "head_dim": 16,
                         "sliding_window": 4, "rope_theta": 10000.0, "qk_scale_factor": 2.5,
                         "post_norm_eps": 1e-6, "final_logit_softcapping": 5.0,
                         "output_multiplier": 0.5, "tie_word_embeddings": False}
VARIANTS.update({
    # The default pattern: three sliding layers (window 4, RoPE), then a NoPE full one.
    "muse_glimmer-f32": ("muse_glimmer", {}, {}),
    # Meta's nested text_config and language_model.* names (vision weights dropped),
    # explicit layer_types and layer_rope_theta (RoPE on the full layer only), rope_theta
    # from rope_parameters, a tied head.
    "muse_glimmer-f32-nested-tied-layertypes": ("muse_glimmer", {
        "num_hidden_layers": 3, "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
        "layer_rope_theta": [1.0, 0, 0], "rope_parameters": {"rope_theta": 500.0, "rope_type": "default"},
        "tie_word_embeddings": True, "sliding_window": 3}, {"glimmer_nested": True}),
    # Full layers only, head_dim 32: plain KV caches, so the quantized-KV decode runs;
    # mlx-lm's defaults for the scales and caps.
    "muse_glimmer-f32-allfull-hd32": ("muse_glimmer", {
        "num_hidden_layers": 2, "head_dim": 32, "layer_types": ["full_attention", "full_attention"],
        "layer_rope_theta": [10000.0, 0]}, {"drop_keys": ["qk_scale_factor", "post_norm_eps",
                                                         "final_logit_softcapping", "output_multiplier"]}),
    "muse_glimmer-q4": ("muse_glimmer", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "muse_glimmer-bf16-q4": ("muse_glimmer", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    "muse_glimmer-small-f32": ("muse_glimmer", dict(SMALL, head_dim=8), {}),
})


# Spark 2.5: one q_k_v_proj, per-layer-type (partial) RoPE from rope_parameters, one
# sigmoid gate per head (g_proj, left dense by quant_predicate) before out_proj, sliding
# and full layers by layer_types, a gelu MLP, model.embedding, a tied head by default.
SPARK_ROPE = {"sliding_attention": {"rope_theta": 10000.0},
              "full_attention": {"rope_theta": 1000000.0, "partial_rotary_factor": 0.5}}
ARCHS["spark2_5"] = {"model_type": "spark2_5", "num_hidden_layers": 4, "head_dim": 16, "sliding_window": 4,
                     "rope_parameters": SPARK_ROPE, "tie_word_embeddings": True}
VARIANTS.update({
    # The default pattern (three sliding layers, window 4, then a full one), tied.
    "spark2_5-f32": ("spark2_5", {}, {}),
    # Biases everywhere, an untied head, explicit layer_types (full then sliding), a
    # quarter of the sliding heads rotated, embed_tokens renamed and rotary buffers.
    "spark2_5-f32-bias-untied-layertypes-hd32": ("spark2_5", {
        "attention_bias": True, "mlp_bias": True, "tie_word_embeddings": False, "head_dim": 32,
        "num_hidden_layers": 2, "layer_types": ["full_attention", "sliding_attention"],
        "rope_parameters": {"sliding_attention": {"rope_theta": 500.0, "partial_rotary_factor": 0.25},
                            "full_attention": {"rope_theta": 10000.0}}}, {"spark_hf_names": True}),
    # Full layers only: plain caches, so the quantized-KV decode runs.
    "spark2_5-f32-allfull-hd32": ("spark2_5", {
        "num_hidden_layers": 2, "head_dim": 32, "layer_types": ["full_attention", "full_attention"]}, {}),
    "spark2_5-q4": ("spark2_5", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "spark2_5-bf16-q4": ("spark2_5", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    "spark2_5-small-f32": ("spark2_5", dict(SMALL, head_dim=8, tie_word_embeddings=False), {}),
})


# Laguna: per-layer query heads, q/k norms, per-layer-type RoPE (YaRN and partial on the
# full layers here), a softplus gate per head, sliding and full layers, a dense first
# layer then sigmoid-routed experts (correction bias, scaling) plus a shared expert.
ARCHS["laguna"] = {
    "model_type": "laguna", "num_hidden_layers": 3, "head_dim": 16, "sliding_window": 4,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    "num_attention_heads_per_layer": [4, 8, 2],
    "rope_parameters": {
        "full_attention": {"rope_theta": 1000000.0, "rope_type": "yarn", "factor": 4.0,
                           "original_max_position_embeddings": 64, "partial_rotary_factor": 0.5},
        "sliding_attention": {"rope_theta": 10000.0},
    },
    "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 48, "moe_routed_scaling_factor": 2.5,
    "tie_word_embeddings": False,
}
VARIANTS.update({
    # Sliding (window 4), full (YaRN, half rotated, 8 heads), sliding (2 heads); the
    # original layout (bare router, bias under experts., experts one by one).
    "laguna-f32": ("laguna", {}, {"laguna_hf": True}),
    # All full (the defaults), soft-capped sqrtsoftplus routing, no gate, biases, a tied
    # head, a top-level partial_rotary_factor, head_dim 32 (the 8-bit KV-cache decode
    # runs), every tensor under language_model..
    "laguna-f32-softcap-sqrtsoftplus-nogate-tied-hd32": ("laguna", {
        "moe_router_logit_softcapping": 3.0, "moe_router_score_func": "sqrtsoftplus", "gating": False,
        "qkv_bias": True, "attention_bias": True, "tie_word_embeddings": True, "partial_rotary_factor": 0.5,
        "head_dim": 32, "mlp_layer_types": ["sparse", "dense", "sparse"]},
        {"drop_keys": ["layer_types", "num_attention_heads_per_layer", "rope_parameters"],
         "language_model_prefix": True}),
    "laguna-q4": ("laguna", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "laguna-bf16-q4": ("laguna", {"moe_intermediate_size": 64}, {"dtype": "bfloat16",
                                                              "quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    "laguna-small-f32": ("laguna", dict(SMALL, head_dim=8, num_attention_heads_per_layer=[4, 8, 2]), {}),
})


# MiMo-V2-Flash: sliding and full layers with their own heads, head sizes (values apart),
# RoPE bases and sinks, partial RoPE, scaled values, DeepSeek-V3's grouped sigmoid router
# (1e-20 in the normalizing sum) with shared experts, an untied head.
ARCHS["mimo_v2_flash"] = {
    "model_type": "mimo_v2_flash", "num_hidden_layers": 3, "hybrid_layer_pattern": [0, 1, 1],
    "moe_layer_freq": [0, 1, 1], "add_swa_attention_sink_bias": True, "add_full_attention_sink_bias": False,
    "sliding_window_size": 4, "moe_intermediate_size": 32, "n_shared_experts": 1, "n_routed_experts": 4,
    "routed_scaling_factor": 2.0, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
    "norm_topk_prob": True, "n_group": 2, "topk_group": 1, "num_experts_per_tok": 2,
    "layernorm_epsilon": 1e-5, "rope_theta": 1000000.0, "swa_rope_theta": 10000.0,
    "swa_num_attention_heads": 8, "swa_num_key_value_heads": 4, "head_dim": 16, "v_head_dim": 8,
    "swa_head_dim": 8, "swa_v_head_dim": 16, "partial_rotary_factor": 0.5, "attention_value_scale": 0.7,
}
VARIANTS.update({
    # Full (no sinks, dense MLP), then two sliding layers (window 4, sinks, experts in
    # groups); HF's experts one by one and a multi-token-prediction layer.
    "mimo_v2_flash-f32": ("mimo_v2_flash", {}, {"mtp_layer": True}),
    # FP8 block-scaled weights, sinks on both kinds, sliding first, experts everywhere,
    # no shared experts or scaling factor, one group, unnormalized scores, no value scale.
    "mimo_v2_flash-f32-fp8-sinks-noshared": ("mimo_v2_flash", {
        "num_hidden_layers": 2, "hybrid_layer_pattern": [1, 0], "moe_layer_freq": [1, 1],
        "add_full_attention_sink_bias": True, "n_shared_experts": None, "routed_scaling_factor": None,
        "n_group": 1, "topk_group": 1, "norm_topk_prob": False}, {"fp8": True, "drop_keys": ["attention_value_scale"]}),
    "mimo_v2_flash-q4": ("mimo_v2_flash", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "mimo_v2_flash-bf16-q4": ("mimo_v2_flash", {"moe_intermediate_size": 64}, {
        "dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    "mimo_v2_flash-small-f32": ("mimo_v2_flash", dict(SMALL, head_dim=8, v_head_dim=8, swa_v_head_dim=8), {}),
})


# AFMoE: mup-scaled embeddings, sandwich norms, per-head q/k norms, RoPE on the sliding
# layers only, a sigmoid gate over the attention output, a dense first layer then
# sigmoid-routed experts (expert_bias, groups) times route_scale plus shared experts.
ARCHS["afmoe"] = {
    "model_type": "afmoe", "num_hidden_layers": 4, "head_dim": 16, "sliding_window": 4,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    "rope_theta": 10000.0, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "num_shared_experts": 1, "num_dense_layers": 1, "route_scale": 2.5, "n_group": 2, "topk_group": 1,
    "tie_word_embeddings": False,
}
VARIANTS.update({
    # Sliding (window 4), full, sliding, full; grouped sigmoid routing, HF's experts one
    # by one.
    "afmoe-f32": ("afmoe", {}, {}),
    # Softmax scores without normalization, two shared experts' width, no mup scaling,
    # YaRN on the sliding layers, a tied head (and HF's rotary buffers), head_dim 32, two
    # dense layers.
    "afmoe-f32-softmax-tied-hd32": ("afmoe", {
        "score_func": "softmax", "route_norm": False, "num_shared_experts": 2, "mup_enabled": False,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
        "tie_word_embeddings": True, "head_dim": 32, "n_group": 1, "num_dense_layers": 2},
        {"extras": True}),
    # All full layers (the 8-bit KV-cache decode runs), one expert chosen (route_norm
    # skipped), no shared experts.
    "afmoe-f32-allfull-top1-noshared-hd32": ("afmoe", {
        "layer_types": ["full_attention"] * 4, "num_experts_per_tok": 1, "num_shared_experts": 0,
        "n_group": 1, "head_dim": 32}, {}),
    "afmoe-q4": ("afmoe", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "afmoe-bf16-q4": ("afmoe", {"moe_intermediate_size": 64}, {"dtype": "bfloat16",
                                                            "quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    "afmoe-small-f32": ("afmoe", dict(SMALL, head_dim=8, num_hidden_layers=3, num_experts=4,
                                      moe_intermediate_size=16,
                                      layer_types=["sliding_attention", "full_attention",
                                                   "sliding_attention"]), {}),
})


# Jamba: Mamba mixers (weighted delta/B/C norms) and attention without RoPE by
# attn_layer_period / offset, experts (softmax over the chosen raw logits) by
# expert_layer_period / offset.
ARCHS["jamba"] = {
    "model_type": "jamba", "num_hidden_layers": 4, "attn_layer_offset": 1, "attn_layer_period": 2,
    "expert_layer_offset": 1, "expert_layer_period": 2, "mamba_d_conv": 4, "mamba_d_state": 8,
    "mamba_expand": 2, "num_experts": 4, "num_experts_per_tok": 2, "tie_word_embeddings": False,
}
VARIANTS.update({
    # Mamba, attention, Mamba, attention; experts on the attention layers; HF's layout
    # (convolutions [C, 1, K], experts one by one).
    "jamba-f32": ("jamba", {}, {}),
    # An explicit layers_block_type, experts on layers 0 and 3 (one chosen), dt rank 6,
    # projection biases without a convolution bias, a tied head.
    "jamba-f32-blocktypes-top1-tied": ("jamba", {
        "layers_block_type": ["attention", "mamba", "mamba", "attention"], "expert_layer_offset": 0,
        "expert_layer_period": 3, "num_experts_per_tok": 1, "mamba_dt_rank": 6, "mamba_proj_bias": True,
        "mamba_conv_bias": False, "tie_word_embeddings": True}, {}),
    # No experts (num_experts 1), head_dim 32 (the 8-bit KV-cache decode runs).
    "jamba-f32-dense-hd32": ("jamba", {"num_experts": 1, "num_attention_heads": 2,
                                        "num_key_value_heads": 1}, {}),
    "jamba-q4": ("jamba", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "jamba-bf16-q4": ("jamba", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    "jamba-small-f32": ("jamba", dict(SMALL, num_hidden_layers=3, intermediate_size=32), {}),
})


# OLMo Hybrid: gated delta-net layers (q/k/v each through its own convolution, beta
# doubled by linear_allow_neg_eigval) and OLMo 2 attention layers (whole-projection q/k
# norms, post-norms), by layer_types (default every fourth layer full).
ARCHS["olmo_hybrid"] = {
    "model_type": "olmo_hybrid", "num_hidden_layers": 4, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4, "linear_allow_neg_eigval": True, "tie_word_embeddings": False,
    "attention_bias": False, "rope_theta": 10000.0,
}
VARIANTS.update({
    # The default layer_types (linear x3, full), beta in [0, 2], HF's convolution layout.
    "olmo_hybrid-f32": ("olmo_hybrid", {}, {}),
    # Full, linear, full, linear; no RoPE (rope_theta null), biases, a tied head, as many
    # key-value heads as heads (null), beta in [0, 1], as many value heads as key heads.
    "olmo_hybrid-f32-types-norope-tied-bias": ("olmo_hybrid", {
        "layer_types": ["full_attention", "linear_attention", "full_attention", "linear_attention"],
        "rope_theta": None, "attention_bias": True, "tie_word_embeddings": True,
        "num_key_value_heads": None, "linear_allow_neg_eigval": False, "linear_num_value_heads": 2}, {}),
    # rope_parameters' base, head_dim 32, layer_norm_epsilon 1e-3 for the gated norms.
    "olmo_hybrid-f32-ropeparams-hd32": ("olmo_hybrid", {
        "rope_parameters": {"rope_theta": 50000.0, "rope_type": "default"}, "head_dim": 32,
        "layer_norm_epsilon": 1e-3}, {}),
    "olmo_hybrid-q4": ("olmo_hybrid", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "olmo_hybrid-bf16-q4": ("olmo_hybrid", {}, {"dtype": "bfloat16",
                                                "quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    "olmo_hybrid-small-f32": ("olmo_hybrid", dict(SMALL, linear_num_value_heads=2, linear_key_head_dim=8,
                                                  linear_value_head_dim=8), {}),
})


# RecurrentGemma (Griffin): 1 + weight norms, recurrent blocks (width-4 convolution,
# RG-LRU scan) and local attention (one key-value head, half the head rotated), by
# block_types cycled over the layers; soft-capped logits.
ARCHS["recurrent_gemma"] = {
    "model_type": "recurrent_gemma", "num_hidden_layers": 4, "attention_bias": False, "conv1d_width": 4,
    "logits_soft_cap": 30.0, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "attention_window_size": 4,
    "block_types": ["recurrent", "recurrent", "attention"], "num_key_value_heads": 1,
}
VARIANTS.update({
    # Recurrent, recurrent, attention, recurrent (the pattern cycled), window 4 crossed,
    # an lm_head, HF's convolution layout.
    "recurrent_gemma-f32": ("recurrent_gemma", {}, {}),
    # `_block_types` (the 9B's name), attention first, no soft cap (0), unscaled embeddings,
    # no lm_head in the checkpoint (the embedding serves), head_dim 32.
    "recurrent_gemma-f32-altnames-tied-hd32": ("recurrent_gemma", {
        "_block_types": ["attention", "recurrent"], "logits_soft_cap": 0.0,
        "embeddings_scale_by_sqrt_dim": False, "num_attention_heads": 2},
        {"drop_keys": ["block_types"], "drop_lm_head": True}),
    "recurrent_gemma-q4": ("recurrent_gemma", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "recurrent_gemma-bf16-q4": ("recurrent_gemma", {}, {"dtype": "bfloat16",
                                                        "quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    "recurrent_gemma-small-f32": ("recurrent_gemma", dict(SMALL, num_key_value_heads=1), {}),
})


# Step 3.5: sliding / full attention (the sliding layers with their own heads), per-layer
# RoPE bases and rotary fractions, YaRN on some layer types, a sigmoid gate per head;
# sigmoid-routed experts with a router bias plus a shared expert, SwiGLUs clamped per
# layer.
ARCHS["step3p5"] = {
    "model_type": "step3p5", "num_hidden_layers": 4, "num_attention_groups": 2, "head_dim": 16,
    "sliding_window": 4, "moe_num_experts": 4, "moe_top_k": 2, "moe_intermediate_size": 32,
    "share_expert_dim": 48, "moe_router_scaling_factor": 2.5,
    "attention_other_setting": {"num_attention_heads": 2, "num_attention_groups": 1},
    "rope_theta": [10000.0, 1000000.0, 10000.0, 1000000.0],
    "partial_rotary_factors": [0.5, 1.0, 0.5, 1.0],
    "swiglu_limits": [None, 7.0, None, 0.5], "swiglu_limits_shared": [1.0, 0.5, None, 0.8],
    "tie_word_embeddings": False,
}
VARIANTS.update({
    # The default pattern (even layers sliding, window 4, 2 heads), per-layer bases and
    # rotary fractions, clamped SwiGLUs; the original layout (moe.*, share_expert.*,
    # norms minus one) with MTP tensors.
    "step3p5-f32": ("step3p5", {}, {"step_vanilla": True}),
    # layer_types full / sliding, YaRN only on the full layers, no head gate, experts on
    # layers 0 and 2 (moe_layers_enum), unnormalized weights, one base, head_dim 32.
    "step3p5-f32-layertypes-yarn-nogate-hd32": ("step3p5", {
        "layer_types": ["full_attention", "sliding_attention", "full_attention", "sliding_attention"],
        "yarn_only_types": ["full_attention"],
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
        "use_head_wise_attn_gate": False, "moe_layers_enum": "0,2", "norm_expert_weight": False,
        "rope_theta": 50000.0, "head_dim": 32, "partial_rotary_factors": None,
        "attention_other_setting": None}, {}),
    "step3p5-q4": ("step3p5", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "step3p5-bf16-q4": ("step3p5", {"moe_intermediate_size": 64, "share_expert_dim": 64},
                        {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    "step3p5-small-f32": ("step3p5", dict(SMALL, num_hidden_layers=3, head_dim=8, moe_intermediate_size=16,
                                          share_expert_dim=16, rope_theta=[10000.0, 1000000.0, 10000.0],
                                          partial_rotary_factors=[0.5, 1.0, 0.5],
                                          swiglu_limits=[None, 0.5, 7.0],
                                          swiglu_limits_shared=[1.0, 0.5, None]), {}),
})


# PLaMo 2: Mamba-2 mixers (weighted B/C/dt norms, one group) and attention (q/k weights
# per head) by mamba_step, offset sandwich norms, fused qkv and gate/up projections.
ARCHS["plamo2"] = {
    "model_type": "plamo2", "num_hidden_layers": 4, "hidden_size_per_head": 16, "mamba_d_state": 8,
    "mamba_d_conv": 4, "mamba_num_heads": 4, "mamba_step": 2, "rms_norm_eps": 1e-6,
}
VARIANTS.update({
    # Mamba, attention, Mamba, attention; a tied head; HF's convolution layout.
    "plamo2-f32": ("plamo2", {}, {}),
    # mamba_step 4 (attention on layer 2 only), one key-value head, an untied head.
    "plamo2-f32-step4-untied": ("plamo2", {"mamba_step": 4, "num_key_value_heads": 1,
                                            "tie_word_embeddings": False}, {}),
    # No Mamba at all (mamba_enabled false).
    "plamo2-f32-nomamba": ("plamo2", {"mamba_enabled": False}, {}),
    "plamo2-q4": ("plamo2", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "plamo2-bf16-q4": ("plamo2", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    "plamo2-small-f32": ("plamo2", dict(SMALL, hidden_size_per_head=8), {}),
})


# Gear: sandwich layers of full attention, sliding attention and a convolutional
# key/value-gated mixer (depthwise convolutions over k and v, sigmoid(q * k) * v); soft-
# capped attention and logits; 1 + weight norms; HF's convolution layout.
ARCHS["gear"] = {
    "model_type": "gear", "num_hidden_layers": 4, "head_dim": 16, "sliding_window": 4,
    "layer_types": ["conv_mixer", "sliding_attention", "conv_mixer", "full_attention"],
    "attn_logit_softcapping": 5.0, "final_logit_softcapping": 10.0, "rope_theta": 10000.0,
}
VARIANTS.update({
    # Conv, sliding, conv, full; soft caps on scores and logits; a tied head.
    "gear-f32": ("gear", {}, {}),
    # No soft caps (the fused attention), biases everywhere (convolutions too), one
    # key-value head, width-4 convolutions, SiLU, an untied head, linear RoPE scaling on
    # the full layers, query_pre_attn_scalar.
    "gear-f32-nocap-bias-untied": ("gear", {
        "attn_logit_softcapping": None, "final_logit_softcapping": None, "attention_bias": True,
        "num_key_value_heads": 1, "conv_L_cache": 4, "hidden_activation": "silu",
        "tie_word_embeddings": False, "query_pre_attn_scalar": 32.0,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0}}, {}),
    # Width-1 convolutions (no window kept), exact GELU, null key-value heads, head_dim 32,
    # no sliding layer.
    "gear-f32-conv1-gelu-hd32": ("gear", {
        "layer_types": ["conv_mixer", "full_attention", "full_attention", "conv_mixer"],
        "conv_L_cache": 1, "hidden_activation": "gelu", "num_key_value_heads": None, "head_dim": 32}, {}),
    "gear-q4": ("gear", {}, {"quant": {"bits": 4, "group_size": 32}}),
    # Sliding and full attention only, for the cases where mlx_lm loads a tokenizer
    # (generation, convert): transformers' strict config check refuses a `layer_types`
    # entry "conv_mixer" in any config it reads.
    "gear-f32-attention-only": ("gear", {"layer_types": ["sliding_attention", "full_attention"] * 2}, {}),
    "gear-q4-attention-only": ("gear", {"layer_types": ["sliding_attention", "full_attention"] * 2},
                               {"quant": {"bits": 4, "group_size": 32}}),
    "gear-bf16-q4": ("gear", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    "gear-small-f32": ("gear", dict(SMALL, head_dim=8), {}),
})


# RWKV-7: token-shift interpolations, LoRA-made decay / learning rate / gate / value
# mixing, the WKV-7 recurrence position by position (mlx-lm's operations path), per-head
# layer norms, relu^2 channel mixing; HF's flat k_k / k_a / g_norm.
ARCHS["rwkv7"] = {
    "model_type": "rwkv7", "num_hidden_layers": 3, "head_dim": 16, "norm_eps": 1e-5,
    "a_low_rank_dim": 64, "v_low_rank_dim": 64, "gate_low_rank_dim": 64, "decay_low_rank_dim": 64,
}
VARIANTS.update({
    # Three layers (the later ones mixing in the first layer's values), an lm_head.
    "rwkv7-f32": ("rwkv7", {}, {}),
    # A tied head, head_dim 32, small ranks.
    "rwkv7-f32-tied-hd32": ("rwkv7", {"tie_word_embeddings": True, "head_dim": 32, "a_low_rank_dim": 8,
                                      "v_low_rank_dim": 16, "gate_low_rank_dim": 8,
                                      "decay_low_rank_dim": 16}, {}),
    # The LoRAs' up projections and the embeddings at 8 bits (quant_predicate's {"bits": 8}
    # takes group size 64, so mlx-lm needs ranks that 64 divides).
    "rwkv7-q4": ("rwkv7", {}, {"quant": {"bits": 4, "group_size": 32}}),
    "rwkv7-bf16-q4": ("rwkv7", {}, {"dtype": "bfloat16", "quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    "rwkv7-small-f32": ("rwkv7", dict(SMALL, head_dim=8, a_low_rank_dim=8, v_low_rank_dim=8,
                                      gate_low_rank_dim=8, decay_low_rank_dim=8), {}),
})


# LongCat-Flash: two MLA sub-blocks per layer (DeepSeek-V3's latent attention with
# q / kv LoRA scales) each with a dense SwiGLU, the first feeding routed experts plus
# identity (zero-compute) experts added after the second; HF's per-expert weights and
# kv_b_proj.
ARCHS["longcat_flash"] = {
    "model_type": "longcat_flash", "attention_method": "MLA", "zero_expert_type": "identity",
    "ffn_hidden_size": 128, "moe_topk": 2, "expert_ffn_hidden_size": 32, "n_routed_experts": 4,
    "zero_expert_num": 2, "num_layers": 2, "kv_lora_rank": 32, "q_lora_rank": 32,
    "qk_rope_head_dim": 8, "qk_nope_head_dim": 32, "v_head_dim": 32, "routed_scaling_factor": 2.0,
    "rope_theta": 10000.0, "mla_scale_q_lora": True, "mla_scale_kv_lora": True, "attention_bias": False,
}
VARIANTS.update({
    # Unnormalized top-2 of 4 routed + 2 identity experts; HF's layout.
    "longcat_flash-f32": ("longcat_flash", {}, {}),
    # Normalized weights, a router bias, biased attention projections, YaRN with
    # mscale_all_dim (the softmax scale grows), top-3.
    "longcat_flash-f32-norm-bias-yarn": ("longcat_flash", {
        "norm_topk_prob": True, "router_bias": True, "attention_bias": True, "moe_topk": 3,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                         "mscale": 1.0, "mscale_all_dim": 1.0}}, {}),
    "longcat_flash-q4": ("longcat_flash", {}, {"quant": {"bits": 4, "group_size": 32}}),
    # Experts of 64 so every expert is quantized (bfloat16 GatherMM does not run on the CPU).
    "longcat_flash-bf16-q4": ("longcat_flash", {"expert_ffn_hidden_size": 64}, {"dtype": "bfloat16",
                                                    "quant": {"bits": 4, "group_size": 64}}),
})
GOLDENS.update({
    "longcat_flash-small-f32": ("longcat_flash", dict(SMALL, ffn_hidden_size=64, expert_ffn_hidden_size=16,
                                                      kv_lora_rank=16, q_lora_rank=16, qk_nope_head_dim=8,
                                                      v_head_dim=8), {}),
})


def wrap_towers(config, weights, wrap):
    """A Pixtral / LFM2-VL checkpoint of a text model (see wrap_towers above)."""
    model_type, text_overrides = wrap
    text = dict(config)
    for k, v in text_overrides.items():
        if v is None:
            text.pop(k, None)
        else:
            text[k] = v
    config = {"model_type": model_type, "text_config": text, "vision_config": {"hidden_size": 8}}
    weights = {f"language_model.{k}": v for k, v in weights.items()}
    weights["vision_tower.patch_conv.weight"] = np.ones((4, 4), np.float32)
    weights["vision_tower.transformer.layers.0.attention.q_proj.weight"] = np.ones((4, 4), np.float32)
    weights["multi_modal_projector.linear_1.weight"] = np.ones((4, 4), np.float32)
    return config, weights


def seed_of(name):
    return zlib.crc32(name.encode())


def mlx_names(config):
    """Parameter names and shapes of mlx-lm's model for this config."""
    if config["model_type"] == "llama4":
        config = llama4_nested(config)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(copy.deepcopy(config)))
    return [(k, v.shape) for k, v in tree_flatten(model.parameters())]


def llama4_nested(config):
    """A Llama 4 config.json: the text model's keys under `text_config`."""
    return {"model_type": "llama4", "text_config": dict(config, model_type="llama4_text"),
            "vision_config": {"hidden_size": 8}}


def random_weights(config, rng):
    out = {}
    gemma = (config["model_type"].startswith("gemma") and config["model_type"] not in ("gemma4_text", "gemma3n")) \
        or config["model_type"] == "gear"
    for name, shape in mlx_names(config):
        if name.endswith("norm.weight"):
            base = 0.0 if gemma else 1.0
            w = base + 0.1 * rng.standard_normal(shape)
        elif name.endswith(("act_fn.alpha_p", "act_fn.alpha_n", "act_fn.beta")):
            w = np.full(shape, 0.5) + 0.1 * rng.standard_normal(shape)  # XieLU's scalars
        elif name.endswith("act_fn.eps"):
            w = np.full(shape, -1e-6)
        elif name.endswith(("layer_scalar", "router.scale")):
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith("bias"):
            w = 0.1 * rng.standard_normal(shape)
        elif config["model_type"] in ("qwen", "gptj") and name.endswith(("ln_1.weight", "ln_2.weight",
                                                                          "ln_f.weight")):
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        elif config["model_type"] == "phixtral" and name.endswith("ln.weight"):
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        elif "embed_tokens" in name or name == "model.embedding.weight" or (config["model_type"] in ("qwen", "gptj", "openelm", "nanochat", "phixtral",
                                                                 "lille-130m")
                                        and name.endswith(("wte.weight", "token_embeddings.weight",
                                                           "tok_embeddings.weight"))):
            w = rng.standard_normal(shape)
        else:
            w = rng.standard_normal(shape) / np.sqrt(shape[-1])
        out[name] = w.astype(np.float32)
    return out


QWEN3_NEXT_NORMS = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight",
                    ".q_norm.weight", ".k_norm.weight")


def to_hf_names(config, weights, opts, rng):
    """Undo mlx-lm's sanitize so the files look like HF checkpoints."""
    mt = config["model_type"]
    out = {}
    for k, v in weights.items():
        if mt in ("Klear", "afmoe") and ".mlp.experts." in k and v.ndim == 3:
            # HF's experts one by one: `mlp.experts.{e}.{proj}.weight`.
            prefix, proj = k.split(".mlp.experts.")
            for e in range(v.shape[0]):
                out[f"{prefix}.mlp.experts.{e}.{proj}"] = v[e]
            continue
        if opts.get("fused_vl_experts") and ".mlp.switch_mlp." in k:
            # Qwen3-VL-MoE's HF experts: gate_up_proj [E, D, 2I], down_proj [E, I, D].
            prefix = k.split(".mlp.switch_mlp.")[0]
            proj = k.split(".")[-2]
            if proj == "down_proj":
                out[f"{prefix}.mlp.experts.down_proj"] = np.ascontiguousarray(np.swapaxes(v, -1, -2))
            elif proj == "gate_proj":
                up = weights[k.replace("gate_proj", "up_proj")]
                out[f"{prefix}.mlp.experts.gate_up_proj"] = np.ascontiguousarray(
                    np.concatenate([np.swapaxes(v, -1, -2), np.swapaxes(up, -1, -2)], axis=-1))
            continue
        if mt in ("qwen3_moe", "qwen2_moe", "olmoe", "glm4_moe", "ernie4_5_moe", "hunyuan",
                  "bailing_moe", "solar_open", "mellum") \
                and ".mlp.switch_mlp." in k and not k.endswith(".bias"):
            # (Stacked expert biases stay as they are: the sanitize of bailing_moe, the only
            # file with them, stacks weights, scales and biases, not `bias`.)
            proj = k.split(".")[-2]
            prefix = k.split(".mlp.switch_mlp.")[0]
            for e in range(v.shape[0]):
                out[f"{prefix}.mlp.experts.{e}.{proj}.weight"] = v[e]
        elif opts.get("fused_hunyuan") and k.endswith((".self_attn.k_proj.weight", ".self_attn.v_proj.weight",
                                                      ".mlp.up_proj.weight")):
            continue  # fused below
        elif opts.get("fused_hunyuan") and k.endswith(".self_attn.q_proj.weight"):
            # HF's qkv_proj: per kv head, its query heads, then its key, then its value.
            n_kv = config["num_key_value_heads"]
            hd = config["hidden_size"] // config["num_attention_heads"]
            parts = [weights[k.replace("q_proj", p)].reshape(n_kv, -1, hd, v.shape[-1])
                     for p in ("q_proj", "k_proj", "v_proj")]
            out[k.replace("q_proj", "qkv_proj")] = np.concatenate(parts, axis=1).reshape(-1, v.shape[-1])
        elif opts.get("fused_hunyuan") and k.endswith(".mlp.gate_proj.weight"):
            out[k.replace("gate_proj", "gate_and_up_proj")] = np.concatenate(
                [weights[k.replace("gate_proj", "up_proj")], v], axis=0)
        elif mt == "bailing_moe" and k.endswith(".mlp.gate.gate_proj.weight"):
            out[k.replace(".gate.gate_proj.", ".gate.")] = v
        elif mt == "mimo_v2_flash" and ".mlp.switch_mlp." in k:
            # HF's experts one by one: `mlp.experts.{e}.{proj}.weight`.
            proj = k.split(".")[-2]
            prefix = k.split(".mlp.switch_mlp.")[0]
            for e in range(v.shape[0]):
                out[f"{prefix}.mlp.experts.{e}.{proj}.weight"] = np.ascontiguousarray(v[e])
        elif mt in ("deepseek_v2", "deepseek") and ".mlp.switch_mlp." in k:
            proj = k.split(".")[-2]
            prefix = k.split(".mlp.switch_mlp.")[0]
            for e in range(v.shape[0]):
                out[f"{prefix}.mlp.experts.{e}.{proj}.weight"] = v[e]
        elif mt == "mistral4" and ".mlp.switch_mlp." in k and not opts.get("per_expert"):
            prefix = k.split(".mlp.switch_mlp.")[0]
            proj = k.split(".")[-2]
            if proj == "down_proj":
                out[f"{prefix}.mlp.experts.down_proj"] = v
            elif proj == "gate_proj":
                up = weights[k.replace("gate_proj", "up_proj")]
                out[f"{prefix}.mlp.experts.gate_up_proj"] = np.concatenate([v, up], axis=1)
        elif mt in ("deepseek_v3", "glm4_moe_lite", "deepseek_v32", "glm_moe_dsa", "mistral4", "longcat_flash"):
            # HF layout: per-expert weights, and `kv_b_proj` instead of MLA's per-head
            # `embed_q` / `unembed_out` (mlx-lm's sanitize splits it).
            if ".mlp.switch_mlp." in k:
                proj = k.split(".")[-2]
                prefix = k.split(".mlp.switch_mlp.")[0]
                for e in range(v.shape[0]):
                    out[f"{prefix}.mlp.experts.{e}.{proj}.weight"] = v[e]
            elif k.endswith(".embed_q.weight") and not opts.get("wrap_kimi_vl"):
                wv = weights[k.replace(".embed_q.", ".unembed_out.")]
                kv = np.concatenate([np.swapaxes(v, 1, 2), wv], axis=1)
                out[k.replace(".embed_q.weight", ".kv_b_proj.weight")] = np.ascontiguousarray(
                    kv.reshape(-1, kv.shape[-1]))
            elif not k.endswith(".unembed_out.weight") or opts.get("wrap_kimi_vl"):
                out[k] = v
        elif mt == "qwen3_next":
            # HF layout: per-expert weights, zero-centred norms, conv1d as [C, 1, K].
            if ".mlp.switch_mlp." in k:
                proj = k.split(".")[-2]
                prefix = k.split(".mlp.switch_mlp.")[0]
                for e in range(v.shape[0]):
                    out[f"{prefix}.mlp.experts.{e}.{proj}.weight"] = v[e]
            elif k.endswith(QWEN3_NEXT_NORMS):
                out[k] = v - np.float32(1.0)
            elif k.endswith("conv1d.weight"):
                out[k] = np.ascontiguousarray(np.moveaxis(v, 1, 2))
            else:
                out[k] = v
        elif mt in ("qwen3_5", "qwen3_5_moe"):
            # HF layout: the text model under model.language_model, the head at the top,
            # zero-centred norms, conv1d as [C, 1, K], experts as fused gate_up_proj.
            name = "lm_head.weight" if k == "language_model.lm_head.weight" else \
                "model.language_model." + k.removeprefix("language_model.model.")
            if k.endswith(QWEN3_NEXT_NORMS):
                v = v - np.float32(1.0)
            elif k.endswith("conv1d.weight"):
                v = np.ascontiguousarray(np.moveaxis(v, 1, 2))
            if ".mlp.switch_mlp." in name:
                prefix = name.split(".switch_mlp.")[0]
                proj = name.split(".")[-2]
                if proj == "down_proj":
                    out[f"{prefix}.experts.down_proj"] = v
                elif proj == "gate_proj":
                    up = weights[k.replace("gate_proj", "up_proj")]
                    out[f"{prefix}.experts.gate_up_proj"] = np.concatenate([v, up], axis=-2)
            else:
                out[name] = v
        elif mt == "gemma4_text" and ".experts.switch_glu." in k:
            # HF layout: gate and up stacked in one `gate_up_proj` [E, 2I, D].
            prefix = k.split(".switch_glu.")[0]
            proj = k.split(".")[-2]
            if proj == "down_proj":
                out[f"{prefix}.down_proj"] = v
            elif proj == "gate_proj":
                up = weights[k.replace("gate_proj", "up_proj")]
                out[f"{prefix}.gate_up_proj"] = np.concatenate([v, up], axis=-2)
        elif mt in ("granitemoehybrid", "granitemoe") and ".block_sparse_moe.switch_mlp." in k:
            prefix = k.split(".switch_mlp.")[0]
            proj = k.split(".")[-2]
            if proj == "down_proj":
                out[f"{prefix}.output_linear.weight"] = v
            elif proj == "gate_proj":
                up = weights[k.replace("gate_proj", "up_proj")]
                out[f"{prefix}.input_linear.weight"] = np.concatenate([v, up], axis=1)
        elif mt == "granitemoehybrid" and ".mlp." in k and not config.get("num_local_experts"):
            prefix = k.split(".mlp.")[0] + ".shared_mlp"
            proj = k.split(".")[-2]
            if proj == "down_proj":
                out[f"{prefix}.output_linear.weight"] = v
            elif proj == "gate_proj":
                up = weights[k.replace("gate_proj", "up_proj")]
                out[f"{prefix}.input_linear.weight"] = np.concatenate([v, up], axis=0)
        elif mt == "jamba" and ".feed_forward.switch_mlp." in k:
            # HF's experts one by one: `feed_forward.experts.{e}.{proj}.weight`.
            prefix, rest = k.split(".feed_forward.switch_mlp.")
            for e in range(v.shape[0]):
                out[f"{prefix}.feed_forward.experts.{e}.{rest}"] = np.ascontiguousarray(v[e])
        elif mt in ("mamba", "falcon_mamba", "mamba2", "granitemoehybrid", "nemotron_h", "falcon_h1", "jamba", "olmo_hybrid", "plamo2") \
                and k.endswith("conv1d.weight"):
            out[k] = np.ascontiguousarray(np.moveaxis(v, 1, 2))  # HF: [C, 1, K]
        elif mt == "rwkv7" and k.endswith(("attn.k_k", "attn.k_a", "g_norm.weight", "g_norm.bias")):
            out[k] = np.ascontiguousarray(v.reshape(-1))  # HF: flat [hidden_size]
        elif mt == "gear" and k.endswith(("key_conv.weight", "value_conv.weight")):
            out[k] = np.ascontiguousarray(np.moveaxis(v, 1, 2))  # HF: [C, 1, K]
        elif mt == "recurrent_gemma" and k.endswith("conv_1d.weight"):
            out[k] = np.ascontiguousarray(np.moveaxis(v, 1, 2))  # HF: [C, 1, K]
        elif mt in ("lfm2", "lfm2_moe") and k.endswith("conv.conv.weight") and not opts.get("wrap_towers"):
            out[k] = np.ascontiguousarray(np.moveaxis(v, 1, 2))  # HF: [C, 1, K]
        elif mt == "lfm2_moe" and ".feed_forward." in k and k.endswith("_proj.weight"):
            # HF layout: w1 / w3 / w2, per-expert weights.
            w = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}[k.split(".")[-2]]
            if ".switch_mlp." in k:
                prefix = k.split(".switch_mlp.")[0]
                for e in range(v.shape[0]):
                    out[f"{prefix}.experts.{e}.{w}.weight"] = v[e]
            else:
                out[k.replace(k.split(".")[-2] + ".weight", w + ".weight")] = v
        elif mt == "exaone_moe" and ".mlp.switch_mlp." in k:
            proj = k.split(".")[-2]
            prefix = k.split(".mlp.switch_mlp.")[0]
            for e in range(v.shape[0]):
                out[f"{prefix}.mlp.experts.{e}.{proj}.weight"] = v[e]
        elif mt == "exaone_moe" and k.endswith(".mlp.gate.e_score_correction_bias"):
            out[k.replace(".mlp.gate.", ".mlp.")] = v
        elif mt == "dots1" and ".mlp.experts." in k and v.ndim == 3:
            proj = k.split(".")[-2]
            prefix = k.split(".mlp.experts.")[0]
            for e in range(v.shape[0]):
                out[f"{prefix}.mlp.experts.{e}.{proj}.weight"] = v[e]
        elif mt == "llama4" and ".feed_forward.experts." in k:
            # HF layout: gate_up_proj [E, D, 2I] and down_proj [E, I, D], no `.weight`.
            prefix = k.split(".feed_forward.experts.")[0] + ".feed_forward.experts"
            proj = k.split(".")[-2]
            if proj == "down_proj":
                out[f"{prefix}.down_proj"] = np.ascontiguousarray(np.swapaxes(v, 1, 2))
            elif proj == "gate_proj":
                up = weights[k.replace("gate_proj", "up_proj")]
                out[f"{prefix}.gate_up_proj"] = np.ascontiguousarray(
                    np.concatenate([np.swapaxes(v, 1, 2), np.swapaxes(up, 1, 2)], axis=-1))
        elif mt in ("mixtral", "phimoe", "minimax") and ".block_sparse_moe.switch_mlp." in k:
            proj = k.split(".")[-2]
            w = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}[proj]
            prefix = k.split(".block_sparse_moe.switch_mlp.")[0]
            for e in range(v.shape[0]):
                out[f"{prefix}.block_sparse_moe.experts.{e}.{w}.weight"] = v[e]
        else:
            out[k] = v
    if mt == "apertus":  # HF's XIELUActivation keeps the alphas as one-element tensors
        out = {k: (v.reshape(1) if k.endswith(("alpha_p", "alpha_n")) else v) for k, v in out.items()}
    if mt == "gpt2":
        # HF layout: unprefixed names, Conv1D weights as [in, out], the causal-mask buffer.
        conv = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")
        out = {k.removeprefix("model."): (np.ascontiguousarray(v.T) if k.endswith(conv) else v)
               for k, v in out.items()}
        n = config["n_positions"]
        for i in range(config["n_layer"]):
            out[f"h.{i}.attn.bias"] = np.tril(np.ones((1, 1, n, n), np.float32))
    if mt == "gptj":
        # HF layout: transformer.* names, and the attention buffers sanitize drops.
        out = {k.replace("model.", "transformer."): v for k, v in out.items()}
        n = config["n_positions"]
        for i in range(config["n_layer"]):
            out[f"transformer.h.{i}.attn.bias"] = np.tril(np.ones((1, 1, n, n), np.float32))
            out[f"transformer.h.{i}.attn.masked_bias"] = np.array(-1e9, np.float32)
    if mt == "gpt_neox":
        # HF layout: gpt_neox.layers.* / gpt_neox.embed_in / gpt_neox.final_layer_norm, embed_out at the top.
        out = {(k.replace("model.embed_out.", "embed_out.").replace("model.h.", "gpt_neox.layers.")
                .replace("model.", "gpt_neox.")): v for k, v in out.items()}
    if mt == "llama4":  # sanitize drops them
        out["vision_model.patch_embedding.linear.weight"] = np.ones((4, 4), np.float32)
        out["multi_modal_projector.linear_1.weight"] = np.ones((4, 4), np.float32)
    if mt in ("granitemoehybrid", "granitemoe") and config.get("tie_word_embeddings", True):
        out["lm_head.weight"] = out["model.embed_tokens.weight"].copy()  # sanitize drops it
    if mt == "gemma4_text":
        # What sanitize drops: the k/v projections and k norm HF keeps on KV-shared
        # layers, rotary buffers and a calibration range.
        n, h = config["num_hidden_layers"], config["hidden_size"]
        first_shared = n - config.get("num_kv_shared_layers", 0)
        hd = config["head_dim"]
        for i in range(first_shared, n):
            p = f"model.layers.{i}.self_attn"
            out[f"{p}.k_proj.weight"] = rng.standard_normal((hd * config["num_key_value_heads"], h)).astype(np.float32)
            out[f"{p}.v_proj.weight"] = rng.standard_normal((hd * config["num_key_value_heads"], h)).astype(np.float32)
            out[f"{p}.k_norm.weight"] = np.ones((hd,), np.float32)
        out["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones((hd // 2,), np.float32)
        out["model.layers.0.mlp.gate_proj.input_max"] = np.ones((), np.float32)
    if mt in ("qwen3_next", "qwen3_5", "qwen3_5_moe", "nemotron_h"):
        out["mtp.fc.weight"] = rng.standard_normal((4, 4)).astype(np.float32)  # sanitize drops it
    if mt == "exaone_moe":  # sanitize drops them
        h = config["hidden_size"]
        out["mtp.fc.weight"] = rng.standard_normal((h, 2 * h)).astype(np.float32)
        out["mtp.layers.0.input_layernorm.weight"] = np.ones((h,), np.float32)
        if config.get("tie_word_embeddings"):
            out["lm_head.weight"] = out["model.embed_tokens.weight"].copy()
    if mt in ("qwen3_5", "qwen3_5_moe"):
        out["model.visual.patch_embed.proj.weight"] = np.ones((4, 4), np.float32)
    if opts.get("hf_mxfp4"):
        out = gpt_oss_hf_experts(out)
    if mt in ("deepseek_v3", "mistral4"):
        for i in range(config["num_hidden_layers"]):  # sanitize drops them
            out[f"model.layers.{i}.self_attn.rotary_emb.inv_freq"] = rng.standard_normal(
                (config["qk_rope_head_dim"] // 2,)).astype(np.float32)
    if opts.get("mtp") and mt in ("glm4_moe", "glm4_moe_lite", "deepseek_v32", "glm_moe_dsa", "solar_open"):
        # GLM's multi-token-prediction layer (one past the last), which sanitize drops.
        n = config["num_hidden_layers"]
        out[f"model.layers.{n}.eh_proj.weight"] = np.ones((config["hidden_size"], 2 * config["hidden_size"]), np.float32)
        out[f"model.layers.{n}.enorm.weight"] = np.ones((config["hidden_size"],), np.float32)
    elif opts.get("mtp") and mt == "ernie4_5_moe":
        # ERNIE's multi-token-prediction tensors and routers' correction biases, dropped by sanitize.
        h = config["hidden_size"]
        out["model.mtp_block.0.input_layernorm.weight"] = np.ones((h,), np.float32)
        out["model.mtp_linear_proj.0.weight"] = np.ones((h, 2 * h), np.float32)
        out["model.layers.1.mlp.moe_statics.e_score_correction_bias"] = np.zeros((1, 4), np.float32)
    elif opts.get("mtp"):
        # MiMo's multi-token-prediction layer, which mlx-lm's sanitize drops.
        out["model.mtp_layers.0.input_layernorm.weight"] = np.ones((config["hidden_size"],), np.float32)
        out["model.mtp_layers.0.token_layernorm.weight"] = np.ones((config["hidden_size"],), np.float32)
    if opts.get("extras") and mt == "gpt_neox":
        # HF's registered buffers, which sanitize drops.
        L = config["max_position_embeddings"]
        for i in range(config["num_hidden_layers"]):
            out[f"gpt_neox.layers.{i}.attention.bias"] = np.tril(np.ones((1, 1, L, L), np.float32))
            out[f"gpt_neox.layers.{i}.attention.masked_bias"] = np.array(-1e9, np.float32)
            out[f"gpt_neox.layers.{i}.attention.rotary_emb.inv_freq"] = rng.standard_normal((2,)).astype(np.float32)
    elif opts.get("extras") and mt == "talkie":
        # Precomputed rotary buffers (sanitize drops `rotary` keys and `cos` / `sin` ones).
        out["model.blocks.0.attn.rotary.inv_freq"] = rng.standard_normal((config["head_dim"] // 2,)).astype(
            np.float32)
        out["model.rope_cos"] = np.ones((4, config["head_dim"]), np.float32)
        out["model.rope_sin"] = np.zeros((4, config["head_dim"]), np.float32)
    elif opts.get("extras") and mt == "lille-130m":
        # HF's rotary buffers (sanitize drops every rotary_emb key); no lm_head.
        head_dim = config["n_embd"] // config["n_head"]
        for i in range(config["n_layer"]):
            out[f"transformer.layers.{i}.attention.rotary_emb.inv_freq"] = rng.standard_normal(
                (head_dim // 2,)).astype(np.float32)
    elif opts.get("extras"):
        head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        rotary = "attention.rope" if mt == "internlm2" else "self_attn.rotary_emb"
        for i in range(config["num_hidden_layers"]):
            out[f"model.layers.{i}.{rotary}.inv_freq"] = rng.standard_normal(
                (head_dim // 2,)).astype(np.float32)
        if config.get("tie_word_embeddings", True) and mt != "internlm2":
            out["lm_head.weight"] = out["model.embed_tokens.weight"].copy()
    return out


def gpt_oss_hf_experts(weights):
    """gpt_oss experts in the original checkpoints' layout: gate and up interleaved
    row by row in `gate_up_proj`, the weights MXFP4 (`uint8` blocks of 16 bytes per 32
    values and `uint8` scales), the biases dense."""
    out = {}
    for k, v in weights.items():
        if ".mlp.experts." not in k:
            out[k] = v
            continue
        prefix, rest = k.split(".mlp.experts.")
        proj, kind = rest.split(".")
        base = f"{prefix}.mlp.experts."
        if proj == "up_proj":
            continue
        if proj == "gate_proj":
            up = weights[f"{base}up_proj.{kind}"]
            both = np.stack([v, up], axis=-2 if kind == "weight" else -1)
            v = both.reshape(*v.shape[:-2], -1, v.shape[-1]) if kind == "weight" else both.reshape(
                *v.shape[:-1], -1)
            name = "gate_up_proj"
        else:
            name = "down_proj"
        if kind == "bias":
            out[f"{base}{name}_bias"] = v
            continue
        wq, scales = mx.quantize(mx.array(v), group_size=32, bits=4, mode="mxfp4")
        blocks = np.array(wq.view(mx.uint8)).reshape(*v.shape[:-1], -1, 16)
        out[f"{base}{name}_blocks"] = blocks
        out[f"{base}{name}_scales"] = np.array(scales)
    return out


def save_weights(path, weights, dtype, shards):
    def cast(v):
        a = mx.array(v)
        return a.astype(getattr(mx, dtype)) if mx.issubdtype(a.dtype, mx.floating) else a

    arrays = {k: cast(v) for k, v in weights.items()}
    path.mkdir(parents=True, exist_ok=True)
    if shards <= 1:
        mx.save_safetensors(str(path / "model.safetensors"), arrays, metadata={"format": "pt"})
        return
    names = sorted(arrays)
    per = (len(names) + shards - 1) // shards
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: arrays[k] for k in names[s * per:(s + 1) * per]}
        mx.save_safetensors(str(path / fname), part, metadata={"format": "pt"})
        weight_map.update({k: fname for k in part})
    total = sum(a.nbytes for a in arrays.values())
    with open(path / "model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def mixed_predicate(path, module):
    if path.endswith("layers.0.mlp.down_proj"):
        return False
    if path.endswith("lm_head") or path.endswith("embed_tokens"):
        return {"group_size": 32, "bits": 8}
    if path.endswith("self_attn.v_proj"):
        return {"group_size": 64, "bits": 6}
    return True


def write_dense(out, name, arch, overrides, opts):
    config = dict(BASE)
    config.update(ARCHS[arch])
    config.update(overrides)
    for k in opts.get("drop_keys", []):  # mlx-lm's default for that key
        config.pop(k, None)
    rng = np.random.default_rng(seed_of(name))
    if arch == "gemma3n":
        # Only the multimodal config exists in mlx-lm; its text model is under
        # model.language_model (HF's names too), the towers beside it.
        config = {"model_type": "gemma3n", "text_config": config,
                  "vision_config": {"hidden_size": 8}, "audio_config": {"hidden_size": 8}}
    if opts.get("wrap_towers", ("",))[0] == "pixtral":
        config["tie_word_embeddings"] = False  # pixtral's __post_init__
    weights = random_weights(config, rng)
    if arch == "gemma3n":
        for tower in ("vision_tower.encoder.weight", "audio_tower.conv.weight",
                      "embed_vision.embedding_projection.weight", "embed_audio.embedding_projection.weight"):
            weights[f"model.{tower}"] = np.ones((4, 4), np.float32)
    if opts.get("lm_head"):
        weights["lm_head.weight"] = (rng.standard_normal(
            (config["vocab_size"], config["hidden_size"])) / np.sqrt(config["hidden_size"])).astype(np.float32)
    elif arch == "gemma3_text":
        weights.pop("lm_head.weight", None)
    if opts.get("drop_lm_head"):
        weights.pop("lm_head.weight", None)
    weights = to_hf_names(config, weights, opts, rng)
    if opts.get("wrap_gemma3"):
        text_config = dict(config)
        config = {"model_type": "gemma3", "vocab_size": config["vocab_size"], "text_config": text_config,
                  "vision_config": {"hidden_size": 8}}
        weights = {f"language_model.{k}": v for k, v in weights.items()}
        weights["vision_tower.vision_model.embeddings.patch_embedding.weight"] = np.ones((4, 4), np.float32)
        weights["multi_modal_projector.mm_input_projection_weight"] = np.ones((4, 4), np.float32)
    if opts.get("wrap_gemma4"):
        # HF layout: the text model under model.language_model, the towers beside it.
        config = {"model_type": "gemma4", "vocab_size": config["vocab_size"], "text_config": dict(config),
                  "vision_config": {"hidden_size": 8}, "audio_config": {"hidden_size": 8}}
        weights = {"model.language_model." + k.removeprefix("model."): v for k, v in weights.items()}
        for tower in ("vision_tower.encoder.weight", "embed_vision.embedding_projection.weight",
                      "audio_tower.conv.weight", "embed_audio.embedding_projection.weight"):
            weights[f"model.{tower}"] = np.ones((4, 4), np.float32)
    if opts.get("wrap_mistral3"):
        config = {"model_type": "mistral3", "text_config": dict(config), "vision_config": {"hidden_size": 8}}
        if opts["wrap_mistral3"] == "old":
            weights = {f"language_model.{k}": v for k, v in weights.items()}
        else:
            weights = {(k if k.startswith("lm_head.") else "model.language_model." + k.removeprefix("model.")): v
                       for k, v in weights.items()}
        weights["vision_tower.patch_conv.weight"] = np.ones((4, 4), np.float32)
        weights["multi_modal_projector.linear_1.weight"] = np.ones((4, 4), np.float32)
    if opts.get("wrap_towers"):
        config, weights = wrap_towers(config, weights, opts["wrap_towers"])
    if opts.get("wrap_vl"):
        # A Qwen2-VL / Qwen3-VL checkpoint: "flat" keeps the text config at the top and the
        # text weights as they are; "nested" has a text_config and the newer
        # `model.language_model.*` names with `lm_head` at the top. Vision weights dropped.
        vl_type, layout = opts["wrap_vl"]
        if layout == "flat":
            config = dict(config, model_type=vl_type)
            weights["visual.patch_embed.proj.weight"] = np.ones((4, 4), np.float32)
        else:
            config = {"model_type": vl_type, "text_config": dict(config, model_type=vl_type + "_text"),
                      "vision_config": {"hidden_size": 8}}
            weights = {(k if k.startswith("lm_head.") else "model.language_model." + k.removeprefix("model.")): v
                       for k, v in weights.items()}
            weights["model.visual.patch_embed.proj.weight"] = np.ones((4, 4), np.float32)
    if opts.get("fp8"):
        # DeepSeek-V3's released layout: every linear weight (experts included) in FP8
        # E4M3 with one `weight_scale_inv` per 128x128 block; sanitize dequantizes them.
        for k in [k for k, v in weights.items() if k.endswith("proj.weight") and v.ndim == 2]:
            w = mx.array(weights[k])
            m, n = w.shape
            scale = mx.abs(w).max() / 448.0
            weights[k] = np.array(mx.to_fp8(w / scale))
            weights[k + "_scale_inv"] = np.full(((m + 127) // 128, (n + 127) // 128), float(scale),
                                                np.float32)
    if config["model_type"] == "dbrx":
        # HF's fused experts: `experts.mlp.{w1, v1, w2}` of [E * ffn, d_model] (w2 transposed).
        fused = {}
        for k in [k for k in weights if ".ffn.experts." in k]:
            prefix, rest = k.split(".ffn.experts.")
            e, proj, _ = rest.split(".")
            v = weights.pop(k)
            fused.setdefault(f"{prefix}.ffn.experts.mlp.{proj}", {})[int(e)] = v.T if proj == "w2" else v
        for fused_name, parts in fused.items():
            weights[fused_name] = np.ascontiguousarray(np.concatenate([parts[e] for e in sorted(parts)], axis=0))
    if config["model_type"] == "phixtral":
        # HF's experts one by one: `moe.mlp.{e}.{fc1, fc2}.{weight, bias}`.
        for k in [k for k in weights if ".moe.switch_mlp." in k]:
            v = weights.pop(k)
            for e in range(v.shape[0]):
                weights[k.replace(".moe.switch_mlp.", f".moe.mlp.{e}.")] = np.ascontiguousarray(v[e])
    if opts.get("fp8_mistral4"):
        # Mistral 4's FP8 layouts: a rank-0 `weight_scale_inv` per linear weight, one per
        # expert ([E, 1, 1]) for the fused experts, 128x128 blocks for kv_b_proj, and
        # static `activation_scale`s that sanitize drops.
        for k in [k for k, v in weights.items() if k.endswith(("proj.weight", "experts.gate_up_proj",
                                                                  "experts.down_proj"))]:
            w = mx.array(weights[k])
            if w.ndim == 3:
                scale = mx.abs(w).max(axis=(1, 2), keepdims=True) / 448.0
                weights[k] = np.array(mx.to_fp8(w / scale))
                weights[k + "_scale_inv"] = np.array(scale)
            elif k.endswith("kv_b_proj.weight"):
                m, n = w.shape
                scale = mx.abs(w).max() / 448.0
                weights[k] = np.array(mx.to_fp8(w / scale))
                weights[k.replace(".weight", ".weight_scale_inv")] = np.full(
                    ((m + 127) // 128, (n + 127) // 128), float(scale), np.float32)
            else:
                scale = mx.abs(w).max() / 448.0
                weights[k] = np.array(mx.to_fp8(w / scale))
                weights[k.replace(".weight", ".weight_scale_inv")] = np.array(scale)
                weights[k.replace(".weight", ".activation_scale")] = np.array(1.0, np.float32)
    if opts.get("wrap_kimi"):
        # A Kimi K2.5 checkpoint: the DeepSeek-V3 text model under `language_model`,
        # vision weights (dropped by sanitize) beside it.
        config = {"model_type": "kimi_k25", "text_config": dict(config), "vision_config": {"hidden_size": 8}}
        weights = {f"language_model.{k}": v for k, v in weights.items()}
        weights["vision_tower.patch_embed.proj.weight"] = np.ones((4, 4), np.float32)
        weights["mm_projector.proj.0.weight"] = np.ones((4, 4), np.float32)
    if opts.get("wrap_kimi_vl"):
        # A Kimi-VL checkpoint: the DeepSeek-V3 text model under `language_model` (HF's
        # per-expert weights and rotary buffers, which sanitize stacks and drops), the
        # vision tower and projector beside it.
        config = {"model_type": "kimi_vl", "text_config": dict(config), "vision_config": {"hidden_size": 8}}
        weights = {f"language_model.{k}": v for k, v in weights.items()}
        weights["vision_tower.encoder.blocks.0.wqkv.weight"] = np.ones((4, 4), np.float32)
        weights["multi_modal_projector.linear_1.weight"] = np.ones((4, 4), np.float32)
    if opts.get("hf_mxfp4"):
        config["quantization_config"] = {"quant_method": "mxfp4"}
    if config["model_type"] == "llama4":
        config = llama4_nested(config)
    if opts.get("mtp_layer"):
        # A multi-token-prediction layer, dropped by sanitize.
        weights["model.mtp.layers.0.proj.weight"] = np.ones((4, 4), np.float32)
    if opts.get("laguna_hf"):
        # Laguna's original layout: a bare router `mlp.gate.weight`, its bias under
        # `experts.`, the experts one by one (sanitize moves and stacks them).
        for k in [k for k in weights if ".mlp.gate.proj." in k or ".mlp.switch_mlp." in k
                  or k.endswith(".mlp.gate.e_score_correction_bias")]:
            v = weights.pop(k)
            if ".mlp.gate.proj." in k:
                weights[k.replace(".mlp.gate.proj.", ".mlp.gate.")] = v
            elif k.endswith("e_score_correction_bias"):
                weights[k.replace(".mlp.gate.", ".mlp.experts.")] = v
            else:
                for e in range(v.shape[0]):
                    weights[k.replace(".mlp.switch_mlp.", f".mlp.experts.{e}.")] = np.ascontiguousarray(v[e])
    if opts.get("step_vanilla"):
        # Step 3.5's original layout: moe.* / share_expert.* names, norms stored minus one,
        # MTP tensors and a layer past the last (sanitize renames, adds one and drops).
        renames = [(".mlp.switch_mlp.", ".moe."), (".mlp.gate.gate.", ".moe.gate."),
                   (".mlp.gate.router_bias", ".moe.router_bias"), (".mlp.share_expert.", ".share_expert.")]
        out_w = {}
        for k, v in weights.items():
            for dst, src in renames:
                if dst in k:
                    k = k.replace(dst, src)
                    break
            if k.endswith(".weight") and "norm" in k:
                v = v - np.float32(1.0)
            out_w[k] = v
        n = config["num_hidden_layers"]
        out_w[f"model.layers.{n}.eh_proj.weight"] = np.ones((4, 4), np.float32)
        out_w["model.mtp.fc.weight"] = np.ones((4, 4), np.float32)
        weights = out_w
    if opts.get("language_model_prefix"):
        weights = {f"language_model.{k}": v for k, v in weights.items()}
    if opts.get("spark_hf_names"):
        # An MLX conversion's embed_tokens name and a serialized RoPE buffer, both undone
        # by sanitize.
        weights["model.embed_tokens.weight"] = weights.pop("model.embedding.weight")
        weights["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones((4,), np.float32)
    if opts.get("glimmer_nested"):
        # Meta's Muse Glimmer layout: the text keys under text_config (over the top-level
        # ones), the text model under language_model.*, the vision tower beside it.
        text = {k: v for k, v in config.items() if k != "model_type"}
        config = {"model_type": config["model_type"], "text_config": text, "hidden_size": 8,
                  "vision_config": {"hidden_size": 8}}
        weights = {f"language_model.{k}": v for k, v in weights.items()}
        weights["vision_tower.patch_embed.weight"] = np.ones((4, 4), np.float32)
        weights["vision_adapter.proj.weight"] = np.ones((4, 4), np.float32)
    if opts.get("text_config"):
        text = dict(config, model_type=config["model_type"] + "_text")
        config = {"model_type": config["model_type"], "text_config": text,
                  "vision_config": {"hidden_size": 8}, "tie_word_embeddings": text["tie_word_embeddings"]}
    dest = out / name
    save_weights(dest, weights, opts.get("dtype", "float32"), opts.get("shards", 1))
    with open(dest / "config.json", "w") as f:
        json.dump(config, f, indent=2)
    return dest


def write_quantized(out, name, arch, overrides, opts):
    q = opts["quant"]
    tmp = write_dense(out, name + ".dense", arch, overrides, {k: v for k, v in opts.items() if k != "quant"})
    model, config = load_model(tmp)
    mode = q.get("mode", "affine")
    model, qconfig = quantize_model(
        model, config, q.get("group_size"), q.get("bits"), mode=mode,
        quant_predicate=mixed_predicate if q.get("mixed") else None,
    )
    dest = out / name
    save_model(dest, model)
    if q.get("mixed"):
        # An explicit `false` entry, as hand-edited mixed configs carry.
        qconfig["quantization"]["model.layers.0.mlp.down_proj"] = False
    save_config(qconfig, config_path=dest / "config.json")
    shutil.rmtree(tmp)
    if opts.get("kv_b_quantized"):
        kv_b_quantized(dest, config, q)
    return dest


def kv_b_quantized(dest, config, q):
    """An MLA checkpoint as converted before mlx-lm split `kv_b_proj`: the quantized
    `embed_q` / `unembed_out` of each layer merged back into one quantized `kv_b_proj`
    (mlx-lm's sanitize dequantizes, splits and quantizes it again)."""
    path = dest / "model.safetensors"
    w = dict(mx.load(str(path)))
    gs, bits = q["group_size"], q["bits"]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}.self_attn"
        parts = []
        for name in ("embed_q", "unembed_out"):
            d = mx.dequantize(w.pop(f"{p}.{name}.weight"), w.pop(f"{p}.{name}.scales"),
                              w.pop(f"{p}.{name}.biases"), group_size=gs, bits=bits)
            parts.append(d.swapaxes(1, 2) if name == "embed_q" else d)
        kv = mx.concatenate(parts, axis=1)
        kv = kv.reshape(-1, kv.shape[-1])
        w[f"{p}.kv_b_proj.weight"], w[f"{p}.kv_b_proj.scales"], w[f"{p}.kv_b_proj.biases"] = mx.quantize(
            kv, group_size=gs, bits=bits)
    mx.save_safetensors(str(path), w, metadata={"format": "mlx"})
    index = dest / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"] = {k: "model.safetensors" for k in sorted(w)}
    index.write_text(json.dumps(data, indent=4))

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--only", default="")
    ap.add_argument("--goldens", action="store_true", help="write the small golden set instead")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    table = GOLDENS if a.goldens else VARIANTS
    if a.list:
        print("\n".join(table))
        return
    only = {s for s in a.only.split(",") if s}
    unknown = only - set(table)
    if unknown:
        sys.exit(f"unknown variant(s): {', '.join(sorted(unknown))}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    mx.set_default_device(mx.cpu)
    for name, (arch, overrides, opts) in table.items():
        if only and name not in only:
            continue
        dest = out / name
        if dest.exists():
            shutil.rmtree(dest)
        if "quant" in opts:
            write_quantized(out, name, arch, overrides, opts)
        else:
            write_dense(out, name, arch, overrides, opts)
        print(f"wrote {dest}")


if __name__ == "__main__":
    main()

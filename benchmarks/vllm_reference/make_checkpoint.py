"""Write the tiny random HF Qwen3-Next checkpoint that real vLLM and flashstate both serve.

    .venv/bin/python benchmarks/vllm_reference/make_checkpoint.py OUT_DIR [--seed 0] [--dtype bfloat16]

4 layers (3 Gated DeltaNet `linear_attention` + 1 `full_attention` at index 3), hidden 128, vocab 2048
(the default flashstate tokenizer, written next to the weights). Shapes are bent to what vLLM CPU 0.32
accepts:
  - attention: 4 query heads, 2 KV heads, head_dim 32 (output-gated, partial RoPE 0.25);
  - Gated DeltaNet: 2 key heads, 4 value heads, head dims 64 (the CPU `chunk_gated_delta_rule` kernel
    only takes head dims 64 and 128), conv kernel 4;
  - FFN: dense (intermediate 384) in layers 0-2 and a tiny MoE (4 experts of 64, top-2, plus a
    sigmoid-gated shared expert of 128) in layer 3 -- vLLM's Qwen3-Next refuses a model with no MoE
    layer ("No Qwen3Next layer found in the model.layers.");
  - stored in bfloat16 (vLLM's CPU GDN path asserts BF16 activations).
Weights come from transformers' own initialisation (in fp32, then cast) under `torch.manual_seed(seed)`:
the same seed, transformers and torch versions give the same bytes. Written with `save_pretrained`
(config.json + model.safetensors); legacy config keys (`rope_theta`, `partial_rotary_factor`,
`torch_dtype`) are added for older transformers readers.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import torch
from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

from flashstate.default_tokenizer import DEFAULT_VOCAB_SIZE, ENDOFTEXT_ID, IM_END_ID, write_default_tokenizer

NUM_LAYERS = 4
LAYER_TYPES = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
ROPE_THETA = 10_000_000.0
PARTIAL_ROTARY = 0.25


def make_config(dtype: str = "bfloat16") -> Qwen3NextConfig:
    return Qwen3NextConfig(
        vocab_size=DEFAULT_VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=NUM_LAYERS,
        layer_types=LAYER_TYPES,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=64,  # vLLM CPU chunk_gated_delta_rule accepts head dims 64 and 128 only
        linear_value_head_dim=64,
        linear_conv_kernel_dim=4,
        # vLLM 0.32's Qwen3-Next refuses a model without any MoE layer ("No Qwen3Next layer found"),
        # so layers 0-2 are dense and the attention layer 3 has a tiny MoE (4 experts, top-2, shared).
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=128,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[0, 1, 2],
        max_position_embeddings=131072,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": ROPE_THETA,
            "partial_rotary_factor": PARTIAL_ROTARY,
        },
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        eos_token_id=IM_END_ID,
        pad_token_id=ENDOFTEXT_ID,
        bos_token_id=None,
        dtype=dtype,
        architectures=["Qwen3NextForCausalLM"],
    )


def make_checkpoint(out: Path, seed: int = 0, dtype: str = "bfloat16") -> Path:
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    # Initialise in fp32 (the same random numbers whatever the stored dtype), then cast.
    model = Qwen3NextForCausalLM(make_config("float32")).eval()
    model.config.dtype = dtype
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(str(out))
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.setdefault("rope_theta", ROPE_THETA)
    cfg.setdefault("partial_rotary_factor", PARTIAL_ROTARY)
    cfg["dtype"] = dtype
    cfg["torch_dtype"] = dtype
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    write_default_tokenizer(out)
    # generation_config.json from save_pretrained may carry sampling defaults; vLLM applies a model's
    # generation config unless told not to, so keep it minimal.
    (out / "generation_config.json").write_text(
        json.dumps({"eos_token_id": IM_END_ID, "pad_token_id": ENDOFTEXT_ID}, indent=2) + "\n"
    )
    return out


def weights_digest(out: Path) -> str:
    return hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()[:16]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--dtype",
        default="bfloat16",
        choices=["bfloat16", "float32"],
        help="stored dtype; vLLM CPU's Gated DeltaNet kernel requires bfloat16",
    )
    a = p.parse_args()
    out = make_checkpoint(a.out, a.seed, a.dtype)
    n = sum(p.numel() for p in Qwen3NextForCausalLM.from_pretrained(str(out)).parameters())
    print(f"wrote {out}: {n} parameters, model.safetensors sha256[:16]={weights_digest(out)}")


if __name__ == "__main__":
    main()

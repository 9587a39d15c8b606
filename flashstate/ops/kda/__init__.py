"""Kimi Delta Attention (gated delta rule with per-channel decay): `chunk_kda`, `fused_recurrent_kda`."""

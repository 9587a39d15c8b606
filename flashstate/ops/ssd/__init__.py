"""Mamba2 state-space duality (SSD): `chunk_ssd` (prefill) and `fused_recurrent_ssd` (decode)."""

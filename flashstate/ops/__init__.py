"""Kernels, FLA-style: `ops/<op>/naive.py` holds the plain-torch oracle (CPU); GPU backends sit beside it.

Conventions shared by every recurrent op (gated delta rule, KDA, Mamba2 SSD, short conv):
- Inputs are a flat varlen batch: `[1, T, H, ...]` (or `[T, D]` for the conv) with `cu_seqlens: [N + 1]`.
- States live in a pool `state_pool: [S, ...]`; sequence i starts from `state_pool[state_indices[i]]`
  (zeros where `has_initial_state[i]` is False) and its final state is written back to the same slot
  in place. Recurrent states are fp32 whatever the activation dtype.
- `export_token_ids: [E]` (flat token indices) asks for the state right after each of those tokens; the
  op returns them as a side output `[E, *state_shape]` computed in the same pass.
- `chunk_*` is the prefill form (chunk-parallel), `fused_recurrent_*` the decode form (token by token);
  the two agree.
"""

# the long-prefill threshold (--long-prefill-token-threshold, vLLM's) in the simulator: the full flashstate (64G host tier) and
# vllm at the headline's flags, 270 s; seed 0 (flashstate alone per threshold, then vllm with and without it), seeds 1-2 all four
cd "$(git rev-parse --show-toplevel)"
COMMON=(--serve-args "--max-num-seqs 48 --max-num-batched-tokens 8192 --kv-cache-memory-bytes 17G" --workload .traces/claude-code
  --agents 48 --warmup 15 --duration 270 --drain 10 --length-scale 0.25 --max-context 65536 --time-scale 0.05 --max-think-time 5
  --max-output-tokens 512 --no-progress)
HOST="--host-cache memory --host-cache-bytes 64G"
.venv/bin/python -m flashstate.cli simulate --policies flashstate,vllm --variant "fs-host=flashstate $HOST" --reference vllm --seed 0 "${COMMON[@]}" --out /tmp/lp/seed0-base
for T in 1024 2048 4096; do
  .venv/bin/python -m flashstate.cli simulate --policies flashstate --variant "fs-host=flashstate $HOST --long-prefill-token-threshold $T" --reference flashstate --seed 0 "${COMMON[@]}" --out /tmp/lp/seed0-cap$T
done
.venv/bin/python -m flashstate.cli simulate --policies vllm --variant "vllm-cap=vllm --long-prefill-token-threshold 2048" --reference vllm --seed 0 "${COMMON[@]}" --out /tmp/lp/seed0-vllm-cap
for S in 1 2; do
  .venv/bin/python -m flashstate.cli simulate --policies vllm --variant "fs-host=flashstate $HOST" --variant "fs-host-cap=flashstate $HOST --long-prefill-token-threshold 2048" --variant "vllm-cap=vllm --long-prefill-token-threshold 2048" --reference vllm --seed $S "${COMMON[@]}" --out /tmp/lp/seed$S
done

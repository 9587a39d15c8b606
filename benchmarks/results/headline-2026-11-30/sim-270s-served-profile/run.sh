# the simulator with the served profile (a fixed cost per prefill step, fitted to session 10's GPU step traces), against the GPU runs:
# the full flashstate (64G host tier) in vLLM's fifo prefill order and arrivals-first, vllm, and vllm given arrivals-first; seeds 0-2
cd "$(git rev-parse --show-toplevel)"
OUT=${OUT:-/tmp/served-sim}
COMMON=(--serve-args "--max-num-seqs 48 --max-num-batched-tokens 8192 --kv-cache-memory-bytes 17G" --workload .traces/claude-code
  --agents 48 --warmup 15 --duration 270 --drain 10 --length-scale 0.25 --max-context 65536 --time-scale 0.05 --max-think-time 5
  --max-output-tokens 512 --no-progress --profile h200-qwen3-next-2b-served)
HOST="--host-cache memory --host-cache-bytes 64G"
for S in 0 1 2; do
  .venv/bin/python -m flashstate.cli simulate --policies vllm --variant "fs-host-fifo=flashstate $HOST --prefill-order fifo" \
    --variant "fs-host=flashstate $HOST" --variant "vllm-af=vllm --prefill-order arrivals-first" --reference vllm --seed $S "${COMMON[@]}" --out $OUT/seed$S
done

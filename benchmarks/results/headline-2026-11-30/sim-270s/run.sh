# the simulator on the session-7 GPU headline's exact flags (270 s window), at the GPU's budget and unbounded
cd "$(git rev-parse --show-toplevel)"
for B in 17G 200G; do
  .venv/bin/python -m flashstate.cli simulate --policies flashstate,vllm --serve-args "--max-num-seqs 48 --max-num-batched-tokens 8192 --kv-cache-memory-bytes $B" --workload .traces/claude-code --seed 0 --agents 48 --warmup 15 --duration 270 --drain 10 --length-scale 0.25 --max-context 65536 --time-scale 0.05 --max-think-time 5 --max-output-tokens 512 --no-progress --out /tmp/sim270/$B
done

# fs-host with and without --host-inline-fetch (both servers graphed, 1,024-token chunks: the defaults), seeds 0-2:
# bash run.sh OUT
cd "$(git rev-parse --show-toplevel)"
for S in 0 1 2; do
  .venv/bin/python -m flashstate.cli simulate --profile h200-qwen3-next-2b-served --policies vllm --variant "fs-host=flashstate --host-cache memory --host-cache-bytes 64G" --variant "fs-inline=flashstate --host-cache memory --host-cache-bytes 64G --host-inline-fetch" --reference vllm --serve-args "--max-num-seqs 48 --max-num-batched-tokens 8192 --kv-cache-memory-bytes 17G" --workload .traces/claude-code --seed $S --agents 48 --warmup 15 --duration 270 --drain 10 --length-scale 0.25 --max-context 65536 --time-scale 0.05 --max-think-time 5 --max-output-tokens 512 --no-progress --out $1/s$S
done

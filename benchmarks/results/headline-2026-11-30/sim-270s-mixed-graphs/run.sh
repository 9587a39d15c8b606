# vllm and the full flashstate (64G host tier) in the simulator with the served H200 profile, with graphed mixed steps
# for both (`bash run.sh OUT graphs "0 1 2"`) or neither (`eager`). graphs-1-chunk-512 ran at commit 66775e6 (buckets of
# one chunk up to 512 tokens), graphs-3-chunks-2048 after the widening (up to three chunks, 2,048 tokens).
cd "$(git rev-parse --show-toplevel)"
for S in $3; do
  .venv/bin/python -m flashstate.cli simulate --profile h200-qwen3-next-2b-served --policies vllm --variant "fs-host=flashstate --host-cache memory --host-cache-bytes 64G" --reference vllm --serve-args "--max-num-seqs 48 --max-num-batched-tokens 8192 --kv-cache-memory-bytes 17G $([ "$2" = graphs ] && echo --mixed-step-graphs)" --workload .traces/claude-code --seed $S --agents 48 --warmup 15 --duration 270 --drain 10 --length-scale 0.25 --max-context 65536 --time-scale 0.05 --max-think-time 5 --max-output-tokens 512 --no-progress --out $1/s$S
done

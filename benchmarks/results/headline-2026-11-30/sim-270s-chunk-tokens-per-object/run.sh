# graphed mixed steps for both servers, fs-host at --host-chunk-tokens 256 (c256) or 1024 (c1024), with the simulated
# restore's per-object cost (sim/host.py RESTORE_SECONDS_PER_OBJECT): bash run.sh OUT "" or bash run.sh OUT "--host-chunk-tokens 1024"
cd "$(git rev-parse --show-toplevel)"
for S in 0 1 2; do
  .venv/bin/python -m flashstate.cli simulate --profile h200-qwen3-next-2b-served --policies vllm --variant "fs-host=flashstate --host-cache memory --host-cache-bytes 64G $2" --reference vllm --serve-args "--max-num-seqs 48 --max-num-batched-tokens 8192 --kv-cache-memory-bytes 17G --mixed-step-graphs" --workload .traces/claude-code --seed $S --agents 48 --warmup 15 --duration 270 --drain 10 --length-scale 0.25 --max-context 65536 --time-scale 0.05 --max-think-time 5 --max-output-tokens 512 --no-progress --out $1/s$S
done

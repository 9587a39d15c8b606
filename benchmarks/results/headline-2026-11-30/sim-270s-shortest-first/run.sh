# running prefills in admission order (fifo-prefills, before 2026-11-30 session 12) against shortest remaining first
# (shortest-first): the same command on each commit, flashstate with and without its 64G host tier, seeds 0-2
cd "$(git rev-parse --show-toplevel)"
for S in 0 1 2; do
  .venv/bin/python -m flashstate.cli simulate --profile h200-qwen3-next-2b-served --policies flashstate --variant "fs-host=flashstate --host-cache memory --host-cache-bytes 64G" --reference flashstate --serve-args "--max-num-seqs 48 --max-num-batched-tokens 8192 --kv-cache-memory-bytes 17G" --workload .traces/claude-code --seed $S --agents 48 --warmup 15 --duration 270 --drain 10 --length-scale 0.25 --max-context 65536 --time-scale 0.05 --max-think-time 5 --max-output-tokens 512 --no-progress --out /tmp/shortest-first/s$S
done

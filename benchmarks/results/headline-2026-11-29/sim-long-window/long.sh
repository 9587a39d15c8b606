cd /work/main
for prof in /tmp/grid/slow.json h200-qwen3-next-2b; do for s in 0 2; do
  n=$(basename $prof .json)-long-s$s
  .venv/bin/python -m flashstate.cli simulate --profile $prof --policies flashstate,vllm --serve-args "--max-num-seqs 48 --max-num-batched-tokens 8192 --kv-cache-memory-bytes 17G" --workload .traces/claude-code --seed $s --agents 48 --warmup 120 --duration 300 --drain 30 --length-scale 0.25 --max-context 65536 --time-scale 0.05 --max-think-time 5 --max-output-tokens 512 --no-progress --out /tmp/grid/$n > /tmp/grid/$n.log 2>&1
done; done
echo fin > /tmp/grid/long.done

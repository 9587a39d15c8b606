cd /work/main
for b in 16G 17G 18G 19G; do for s in 0 1 2; do
  d=/tmp/grid/$b-s$s
  .venv/bin/python -m flashstate.cli simulate --policies flashstate,vllm,sglang --serve-args "--max-num-seqs 48 --max-num-batched-tokens 8192 --kv-cache-memory-bytes $b" --workload .traces/claude-code --seed $s --agents 48 --warmup 15 --duration 50 --drain 10 --length-scale 0.25 --max-context 65536 --time-scale 0.05 --max-think-time 5 --max-output-tokens 512 --no-progress --out $d > $d.log 2>&1
done; done
echo finished > /tmp/grid/done

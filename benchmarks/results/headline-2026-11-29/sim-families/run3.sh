cd /work/main
for b in 6G 8G 10G 12G 16G; do
  d=/tmp/fam/latent-kimi-linear-2b-$b
  .venv/bin/python -m flashstate.cli simulate --model kimi-linear-2b --policies flashstate,vllm --serve-args "--max-num-seqs 48 --max-num-batched-tokens 8192 --kv-cache-memory-bytes $b" --workload .traces/claude-code --seed 0 --agents 48 --warmup 15 --duration 50 --drain 10 --length-scale 0.25 --max-context 65536 --time-scale 0.05 --max-think-time 5 --max-output-tokens 512 --no-progress --out $d > $d.log 2>&1
done
echo fin > /tmp/fam/done3

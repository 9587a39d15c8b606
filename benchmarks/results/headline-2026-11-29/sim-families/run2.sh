cd /work/main
for mb in nemotron-h-2b:13G nemotron-h-2b:14G kimi-linear-2b:40G kimi-linear-2b:60G kimi-linear-2b:80G; do
  m=${mb%%:*}; b=${mb##*:}; d=/tmp/fam/$m-$b
  .venv/bin/python -m flashstate.cli simulate --model $m --policies flashstate,vllm --serve-args "--max-num-seqs 48 --max-num-batched-tokens 8192 --kv-cache-memory-bytes $b" --workload .traces/claude-code --seed 0 --agents 48 --warmup 15 --duration 50 --drain 10 --length-scale 0.25 --max-context 65536 --time-scale 0.05 --max-think-time 5 --max-output-tokens 512 --no-progress --out $d > $d.log 2>&1
done
echo fin > /tmp/fam/done2

cd "$(git rev-parse --show-toplevel)"
# usage: bash run.sh nemotron-h-2b 13G; bash run.sh kimi-linear-2b 11G (the other families at their headline budgets, 120 s)
M=$1; B=$2
.venv/bin/python -m flashstate.cli simulate --model $M --policies flashstate,vllm --variant "fs-host=flashstate --host-cache memory --host-cache-bytes 64G" --reference vllm --serve-args "--max-num-seqs 48 --max-num-batched-tokens 8192 --kv-cache-memory-bytes $B" --workload .traces/claude-code --seed 0 --agents 48 --warmup 15 --duration 120 --drain 10 --length-scale 0.25 --max-context 65536 --time-scale 0.05 --max-think-time 5 --max-output-tokens 512 --no-progress --out /tmp/fam2/$M-$B > /tmp/fam2-$M.log 2>&1

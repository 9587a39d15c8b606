# the full flashstate (host tier, 32G in memory) against flashstate without it and vllm, the session-7 GPU headline's flags
cd "$(git rev-parse --show-toplevel)"
for S in 0 1 2; do
  .venv/bin/python -m flashstate.cli simulate --policies flashstate,vllm --variant "fs-host=flashstate --host-cache memory --host-cache-bytes 32G" --reference vllm --serve-args "--max-num-seqs 48 --max-num-batched-tokens 8192 --kv-cache-memory-bytes 17G" --workload .traces/claude-code --seed $S --agents 48 --warmup 15 --duration 270 --drain 10 --length-scale 0.25 --max-context 65536 --time-scale 0.05 --max-think-time 5 --max-output-tokens 512 --no-progress --out /tmp/simhost/s$S
done
# host capacity: 64G at seeds 0-2 and 16G at seed 1 (fs-host only; vllm as above)
for A in "0 64G" "1 64G" "2 64G" "1 16G"; do
  set -- $A
  .venv/bin/python -m flashstate.cli simulate --policies flashstate --variant "fs-host=flashstate --host-cache memory --host-cache-bytes $2" --reference flashstate --serve-args "--max-num-seqs 48 --max-num-batched-tokens 8192 --kv-cache-memory-bytes 17G" --workload .traces/claude-code --seed $1 --agents 48 --warmup 15 --duration 270 --drain 10 --length-scale 0.25 --max-context 65536 --time-scale 0.05 --max-think-time 5 --max-output-tokens 512 --no-progress --out /tmp/hostsweep/s$1-$2
done

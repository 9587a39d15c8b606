# the simulator's prediction for the next GPU headline run (300 s window, the headline's flags otherwise)
cd /work/main
.venv/bin/python -m flashstate.cli simulate --policies flashstate,vllm,sglang,none --serve-args "--max-num-seqs 48 --max-num-batched-tokens 8192 --kv-cache-memory-bytes 17G" --workload .traces/claude-code --seed 0 --agents 48 --warmup 15 --duration 300 --drain 10 --length-scale 0.25 --max-context 65536 --time-scale 0.05 --max-think-time 5 --max-output-tokens 512 --no-progress --out /tmp/sim300/17G-s0

#!/usr/bin/env bash
# Drive `flashstate serve` (the embedded default model) with AIPerf: streaming chat, the multi-turn agent
# sessions in multi_turn.jsonl, the model's own tokenizer folder. Fails unless every request succeeds.
# AIPerf lives in its own venv (it pins its own dependencies): $AIPERF_VENV, default ~/.cache/flashstate/aiperf.
# Usage: bash benchmarks/aiperf/run.sh [extra `aiperf profile` flags]
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${AIPERF_VENV:-$HOME/.cache/flashstate/aiperf}"
OUT="${AIPERF_OUT:-out/aiperf}"
PORT="${PORT:-8765}"
[ -x "$VENV/bin/aiperf" ] || { python3 -m venv "$VENV" && "$VENV/bin/pip" install -q "aiperf==0.13.0"; }
TOKENIZER=$(.venv/bin/python -c "from flashstate.models.presets import default_model_dir; print(default_model_dir())")

mkdir -p "$(dirname "$OUT")"
.venv/bin/flashstate serve --port "$PORT" >"$(dirname "$OUT")/aiperf-server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.5; done

rm -rf "$OUT"
"$VENV/bin/aiperf" profile --model flashstate-tiny --url "http://127.0.0.1:$PORT" \
  --endpoint-type chat --streaming \
  --input-file benchmarks/aiperf/multi_turn.jsonl --custom-dataset-type multi_turn \
  --tokenizer "$TOKENIZER" --concurrency 4 --request-count 16 --extra-inputs ignore_eos:true \
  --output-artifact-dir "$OUT" --ui-type simple "$@"
"$VENV/bin/python" - "$OUT/profile_export_aiperf.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
done, errors = d["completed_request_count"]["avg"], d["error_summary"]
print(f"aiperf: {done:.0f} requests completed, errors: {errors or 'none'}")
sys.exit(1 if errors or d["request_error_rate"]["avg"] else 0)
EOF

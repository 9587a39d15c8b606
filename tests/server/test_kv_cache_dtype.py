"""`flashstate serve --kv-cache-dtype fp8`: a real server process answers chat requests from an fp8 KV
cache (the second turn hits the first's prefix); an unknown value stops the command line with an error
naming the flag."""

import subprocess
import sys

from tests.server.conftest import running_server


def test_serve_with_an_fp8_kv_cache_answers_chat_with_prefix_hits(tmp_path):
    args = ["--kv-cache-dtype", "fp8", "--prefill-cost-coefficients", "1e-5", "1e-9"]
    with running_server(tmp_path, args) as server:
        messages = [
            {"role": "user", "content": "Write a haiku about a cache that forgets half of each number."}
        ]
        body = {"model": "flashstate-tiny", "messages": messages, "max_tokens": 8, "temperature": 0}
        status, first = server.post_json("/v1/chat/completions", body)
        assert status == 200, first
        reply = first["choices"][0]["message"]["content"]
        assert first["usage"]["completion_tokens"] == 8 and reply
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "And another."}]
        status, second = server.post_json("/v1/chat/completions", {**body, "messages": messages})
        assert status == 200, second
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        assert "KV cache torch.float8_e4m3fn" in server.log_tail(100_000)


def test_an_unknown_kv_cache_dtype_is_refused_naming_the_flag():
    cmd = [sys.executable, "-m", "flashstate.cli", "serve", "--kv-cache-dtype", "int8"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--kv-cache-dtype" in done.stderr and "int8" in done.stderr, done.stderr

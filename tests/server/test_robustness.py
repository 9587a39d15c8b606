"""What a client could do to the server, as regression tests through real server processes: requests that
once killed the engine, a request the engine fails (it fails alone), an engine that cannot go on (the
process exits non-zero), a stalled loop (/health says so), a request the cache livelocked on, API keys
(several, bytes that are not ASCII) and cache tenants (salts, keys: the prefix cache is no oracle across
them)."""

import concurrent.futures
import time

import openai
import pytest

from tests.server.conftest import Server, assert_error, running_server
from tests.server.fault_server import FATAL, HOLD, POISON, RELEASE_ENV

COST = ["--prefill-cost-coefficients", "1e-5", "1e-10"]  # no calibration at start-up


def _chat(n: int) -> list[dict]:
    msgs = [{"role": ("user", "assistant")[i % 2], "content": f"message {i} hello"} for i in range(n)]
    return [*msgs, {"role": "user", "content": "go"}]


@pytest.fixture(scope="module")
def short(module_tmp):
    with running_server(module_tmp, ["--max-model-len", "64", "--enable-dev-endpoints", *COST]) as s:
        yield s


def test_a_chat_without_max_tokens_ends_at_the_context_limit(short):
    client = short.client()
    for _ in range(2):  # the engine lives on
        r = client.chat.completions.create(
            model="flashstate-tiny", messages=[{"role": "user", "content": "hi"}], temperature=0,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        assert r.choices[0].finish_reason == "length"
        assert r.usage.prompt_tokens + r.usage.completion_tokens == 64
    assert short.request("GET", "/health")[0] == 200


@pytest.mark.parametrize(
    "extra, param",
    [({"stop_token_ids": [2**63]}, "stop_token_ids"), ({"stop_token_ids": [10**20]}, "stop_token_ids"),
     ({"seed": 2**64}, "seed"), ({"stop": ["x"] * 300}, "stop"), ({"temperature": 1e400}, "temperature")],
)  # fmt: skip
def test_out_of_range_fields_are_a_400_naming_the_field(short, extra, param):
    status, body = short.post_json("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 2, **extra})
    assert assert_error(status, body, 400)["param"] == param
    assert short.request("GET", "/health")[0] == 200


def test_top_k_past_the_vocabulary_keeps_every_token(short):
    body = {"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    status, plain = short.post_json("/v1/completions", {**body, "return_token_ids": True})
    for top_k in (2**63, 10**30):
        status, out = short.post_json("/v1/completions", {**body, "top_k": top_k, "return_token_ids": True})
        assert status == 200 and out["choices"][0]["token_ids"] == plain["choices"][0]["token_ids"]
    assert short.request("GET", "/health")[0] == 200


def test_an_authorization_header_that_is_not_ascii_is_a_401(module_tmp):
    with running_server(module_tmp, ["--api-key", "k-one", "k-two", *COST]) as s:
        for key in ("k-one", "k-two"):
            r = s.request("GET", "/v1/models", headers={"Authorization": f"Bearer {key}"})
            assert r[0] == 200
        for header in (b"Bearer k-\xe9", "Bearer ключ".encode(), b"\xff\xfe"):
            status, body = s.request("GET", "/v1/models", headers={"Authorization": header})
            assert status == 401, body


# ---- faults injected into the engine (tests/server/fault_server.py) ------------------------------------


@pytest.fixture
def faulty(tmp_path, monkeypatch):
    monkeypatch.setenv(RELEASE_ENV, str(tmp_path / "release"))
    args = ["--kv-cache-memory-bytes", "8M", "--max-model-len", "8k", "--engine-stall-seconds", "1", *COST]
    server = Server(args, tmp_path / "server.log", module="tests.server.fault_server")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def _complete(server: Server, first: int, n: int = 8) -> tuple[int, dict]:
    body = {"prompt": [first, 5, 6, 7], "max_tokens": n, "temperature": 0, "ignore_eos": True}
    return server.post_json("/v1/completions", body)


def test_a_request_the_engine_fails_gets_a_500_and_the_rest_are_served(faulty):
    _, alone = _complete(faulty, 11)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(_complete, faulty, first) for first in (11, POISON, 11, 12)]
        results = [f.result() for f in futures]
    assert_error(*results[1], 500, "request_failed")
    assert all(status == 200 for status, _ in (results[0], results[2], results[3]))
    assert results[0][1]["choices"][0]["text"] == alone["choices"][0]["text"]
    # streamed, the failure is an error event and the stream ends
    client = faulty.client()
    with pytest.raises(openai.APIError):
        for _ in client.completions.create(
            model="flashstate-tiny", prompt=[POISON, 1], max_tokens=4, stream=True
        ):
            pass
    assert faulty.request("GET", "/health")[0] == 200
    status, again = _complete(faulty, 11)
    assert status == 200 and again["choices"][0]["text"] == alone["choices"][0]["text"]


def test_a_stalled_engine_loop_is_unhealthy_until_it_moves(faulty, tmp_path):
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        held = pool.submit(_complete, faulty, HOLD)
        for _ in range(1200):  # the 1 s bound passes while the step is held (a guard, not a threshold)
            if faulty.request("GET", "/health")[0] == 503:
                break
            assert not held.done(), held.result()  # the held request must not have ended
            time.sleep(0.1)
        else:
            raise AssertionError("/health never reported the stalled engine")
        (tmp_path / "release").touch()
        assert held.result()[0] == 200
    assert faulty.request("GET", "/health")[0] == 200


def test_an_engine_that_cannot_go_on_exits_non_zero(faulty):
    status, body = _complete(faulty, FATAL)
    assert_error(status, body, 500, "engine_dead")
    assert faulty.proc.wait(timeout=60) == 1


def test_a_hit_that_locks_the_budget_does_not_block_the_queue(faulty):
    """The demo's 8M budget: a 500-message chat hitting a 250-message one's checkpoints was never admitted."""
    client = faulty.client(timeout=120)
    for n in (250, 500):
        r = client.chat.completions.create(model="flashstate-tiny", messages=_chat(n), max_tokens=4)
        assert r.choices[0].finish_reason in ("stop", "length")
    assert faulty.request("GET", "/health")[0] == 200


# ---- tenants --------------------------------------------------------------------------------------------

VICTIM, ATTACKER = "key-victim", "key-attacker"


@pytest.fixture(scope="module")
def tenants(module_tmp):
    args = ["--api-key", VICTIM, ATTACKER, "--api-key-cache-isolation", *COST]
    with running_server(module_tmp, args) as s:
        yield s


def _cached(server: Server, key: str, messages: list[dict], salt: str | None = None) -> int:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)
    extra = {"cache_salt": salt} if salt is not None else {}
    r = client.chat.completions.create(
        model="flashstate-tiny", messages=messages, max_tokens=2, temperature=0, extra_body=extra
    )
    return r.usage.prompt_tokens_details.cached_tokens


def _system(code: str) -> list[dict]:
    text = "You are the vault's assistant. " * 20 + f"The vault code is {code}. Never say it."
    return [{"role": "system", "content": text}]


def test_cache_salts_separate_requests_of_one_key(tenants):
    base = _system("0000") + [{"role": "user", "content": "first"}]
    _cached(tenants, VICTIM, base, salt="a")
    nxt = base + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "second"}]
    assert _cached(tenants, VICTIM, nxt, salt="b") == 0
    assert _cached(tenants, VICTIM, nxt, salt="a") > 0


def test_the_prefix_cache_is_no_oracle_across_api_keys(tenants):
    """A 4-digit secret in another client's system prompt: the attacker sends its guesses after the same
    system prompt and reads cached_tokens. Within one key the right guess shows (the cache works); across
    keys, whatever salt the attacker sends, even the right guess finds nothing of the victim's."""
    _cached(tenants, VICTIM, _system("4821") + [{"role": "user", "content": "hello"}])
    probe = [{"role": "user", "content": "what is the weather"}]
    same_key = {g: _cached(tenants, VICTIM, _system(g) + probe) for g in ("1234", "4821")}
    assert same_key["4821"] > same_key["1234"]  # the side channel within a tenant: a real hit
    for salt in (None, "x"):  # the attacker's first probe of each salt, with the right guess
        assert _cached(tenants, ATTACKER, _system("4821") + probe, salt) == 0


def test_reset_prefix_cache_leaves_the_pools_whole(short):
    for i in range(3):
        short.post_json("/v1/completions", {"prompt": [i + 1] * 20, "max_tokens": 3})
    status, pools = short.post_json("/reset_prefix_cache", b"")
    assert status == 200
    assert (
        pools["free_blocks"] == pools["num_blocks"] and pools["free_state_slots"] == pools["num_state_slots"]
    )
    assert (pools["running"], pools["waiting"]) == (0, 0)

"""Chat replies that come back re-tokenized (SimReplay's `unspliced_per_token`, a recorded run's server before
85d4391): the next turn leaves the cached path at the reply's first token, so it resumes at the previous
prompt's end instead of the previous turn's frontier; with the chance 0 every reply is spliced."""

from flashstate.sim.recorded import UNSPLICED_PER_TOKEN, simulate_argv

from .helpers import growing, run
from .test_recorded import _result

FLAGS = ["--kv-cache-memory-bytes", "4G"]  # ample: nothing is evicted


def _continuations(q: float) -> list:
    sessions = [growing(f"s{i}", 4, first=2000 + 300 * i, step=500, out=60, think=0.5) for i in range(4)]
    result, _ = run(sessions, "flashstate", FLAGS, mode="chat", unspliced_per_token=q)
    return [r for r in result.requests if r.frontier is not None]


def test_spliced_replies_keep_every_continuation_at_its_frontier():
    later = _continuations(0.0)
    assert len(later) == 12 and all(r.cached_tokens >= r.frontier - 16 for r in later)


def test_an_unspliced_reply_sends_the_next_turn_back_to_the_previous_prompt_s_end():
    later = _continuations(0.5)  # a 60-token reply comes back re-tokenized with chance 1 - 0.5^60
    assert len(later) == 12
    for r in later:
        short = r.frontier - r.cached_tokens
        # resumed where the previous reply began (its prompt's end), the reply's 59 cached ids lost
        assert 59 - 16 <= short <= 59 + 16, (r.session, r.turn, r.cached_tokens, r.frontier)


def test_a_chat_run_recorded_before_the_fix_replays_its_unspliced_replies():
    def argv(created: str, mode: str) -> list[str]:
        result = _result(created)
        result["replay"] = result["replay"] | {"mode": mode}
        return simulate_argv(result, "h200-qwen3-next-2b", "T")

    before = argv("2026-12-04T15:55:37+00:00", "chat")
    assert before[before.index("--chat-unspliced-per-token") + 1] == repr(UNSPLICED_PER_TOKEN)
    assert UNSPLICED_PER_TOKEN == 3 / 2048
    assert "--chat-unspliced-per-token" not in argv("2026-12-06T04:00:00+00:00", "chat")
    assert "--chat-unspliced-per-token" not in argv("2026-12-04T15:55:37+00:00", "completions")

from flashstate.bench.step_summary import summarize_rows


def _row(t, ms, prefill=0, decode=0, **extra):
    shape = dict(prefill_tokens=prefill, prefill_seqs=int(prefill > 0), decode_seqs=decode)
    queues = dict(running=1, waiting=0, prefill_pairs=prefill * prefill, decode_context=100 * decode)
    return dict(t=t, ms=ms, **shape, **queues, **extra)


def test_time_splits_into_prefill_and_decode_steps_and_the_host_tier():
    rows = [
        _row(0.0, 100, prefill=1000, schedule_ms=5, host_ms=40),
        _row(0.1, 10, decode=4, schedule_ms=0, host_ms=0),
        _row(0.2, 30, prefill=200, decode=4, schedule_ms=1, host_ms=2.5),
    ]
    s = summarize_rows(rows)
    assert s["seconds_in_prefill_steps"] == 0.13 and s["seconds_in_decode_steps"] == 0.01
    assert s["prefill_tok_per_s_in_prefill_steps"] == 1200 / 0.13
    assert s["seconds_scheduling"] == 0.006 and s["seconds_in_host_tier"] == 0.0425


def test_rows_without_the_optional_fields_give_none():
    s = summarize_rows([_row(0.0, 10, decode=1)])
    assert s["seconds_scheduling"] is None and s["seconds_in_host_tier"] is None
    assert summarize_rows([]) is None

"""A checkpoint whose embedding has more rows than its tokenizer has tokens (padding rows, as Qwen3-Next's
151,936 over 151,665 tokens): the engine never samples an id that decodes to nothing."""

import json

from flashstate import LLM, SamplingParams
from flashstate.default_tokenizer import DEFAULT_VOCAB_SIZE
from flashstate.models.presets import materialize_config
from flashstate.spec.preset_configs import preset_config


def test_padding_rows_of_the_embedding_are_never_sampled(tmp_path):
    config = preset_config("tiny") | {"vocab_size": 4 * DEFAULT_VOCAB_SIZE}
    model_dir = materialize_config(config, tmp_path / "padded", seed=1)
    assert json.loads((model_dir / "config.json").read_text())["vocab_size"] == 4 * DEFAULT_VOCAB_SIZE
    llm = LLM(str(model_dir), device="cpu")
    assert llm.engine.tokenizer.id_limit == DEFAULT_VOCAB_SIZE
    params = SamplingParams(temperature=1.5, max_tokens=48, ignore_eos=True, seed=3)
    outs = llm.generate([[5, 6, 7, 8], [100, 200, 300]], params)
    for out in outs:
        ids = out.token_ids
        assert len(ids) == 48 and max(ids) < DEFAULT_VOCAB_SIZE
        assert out.text == llm.engine.tokenizer.decode(ids)

"""flashstate: inference for hybrid (attention + linear/SSM) LLMs with a prefix cache built for agents."""

from flashstate.config import EngineConfig
from flashstate.llm import LLM
from flashstate.sampling_params import SamplingParams

__all__ = ["LLM", "EngineConfig", "SamplingParams"]
__version__ = "0.1.0"

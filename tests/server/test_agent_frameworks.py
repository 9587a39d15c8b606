"""Agent frameworks against a real server: mini-swe-agent (its default tool-calling agent, over litellm's
`hosted_vllm/` provider) runs three steps. The embedded model has random weights, so the agent's model
settings ask for `tool_choice: "required"`: the grammar makes every reply a valid `bash` call. The commands
are recorded, never run (random text is no command to execute)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.server.conftest import Server

minisweagent = pytest.importorskip("minisweagent")

from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.environments.local import LocalEnvironment  # noqa: E402
from minisweagent.models.litellm_model import LitellmModel  # noqa: E402

STEPS = 3


class RecordingEnvironment(LocalEnvironment):
    """Answers every command with a fixed observation instead of running it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.commands: list[str] = []

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict:
        self.commands.append(action.get("command", ""))
        return {"output": "ok\n", "returncode": 0, "exception_info": ""}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("agents") / "server.log"
    s = Server(
        ["--device", "cpu", "--prefill-cost-coefficients", "1e-5", "1e-10", "--served-model-name", "tiny"],
        log,
    )
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


def test_mini_swe_agent_three_tool_calling_steps(server, tmp_path):
    config = yaml.safe_load((Path(minisweagent.__file__).parent / "config" / "mini.yaml").read_text())
    agent_config = {k: v for k, v in config["agent"].items() if k != "mode"}  # mode: the interactive agent's
    agent_config |= {"step_limit": STEPS, "cost_limit": 0}
    templates = {k: v for k, v in config["model"].items() if k.endswith("_template")}
    model = LitellmModel(
        model_name="hosted_vllm/tiny",
        model_kwargs={
            "api_base": f"{server.url}/v1",
            "api_key": "none",
            "tool_choice": "required",
            "parallel_tool_calls": False,
            # random weights rarely close a JSON string: sampled (greedy may never), with room to finish
            "temperature": 1.0,
            "seed": 0,
            "max_tokens": 2000,
        },
        cost_tracking="ignore_errors",
        **templates,
    )
    env = RecordingEnvironment(**config.get("environment", {}))
    agent = DefaultAgent(model, env, **agent_config)
    result = agent.run("List the files in the repository.")
    assert result.get("exit_status") == "LimitsExceeded", result
    calls = [m for m in agent.messages if m.get("role") == "assistant"]
    assert len(calls) == STEPS
    assert all(m["extra"]["actions"] for m in calls)  # every step parsed a bash call
    assert len(env.commands) >= STEPS
    tool_results = [m for m in agent.messages if m.get("role") == "tool"]
    assert len(tool_results) >= STEPS - 1  # each next turn carried the previous call's result

"""The embedded default workload: `synthetic.fit()` of the 166 Claude-Code sessions in
`shared/traces/claude-code` (AgentX format, Apache-2.0), values at the quantiles `synthetic.PROBS`
(0, 10, ..., 90, 95, 99, 100 %). Regenerate with `flashstate bench stats <traces>` ("fitted"); the tests
check these still are the fit.

Sub-agents appear in 3 of the 166 sessions (8 sub-agents, 5 groups); where they have fewer than 4 samples
the value is set by hand (#): sub-agents never wait on a user, and both observed rewrites kept 99.9 % of
the prompt and added 6861 and 13304 tokens.
"""

from flashstate.bench.synthetic_config import AgentShape, SyntheticConfig
from flashstate.bench.synthetic_config import Quantiles as Q

# fmt: off
MAIN = AgentShape(
    prefix_tokens=15172,
    first_context=Q((129.0, 955.0, 3789.0, 6178.5, 29365.0, 54253.0, 80411.0, 98094.5, 124835.0, 246224.0,
                     398709.5, 820401.1, 837120.0)),
    turns=Q((3.0, 5.5, 10.0, 16.5, 24.0, 32.5, 40.0, 51.5, 67.0, 89.0, 126.0, 162.45, 170.0)),
    turns_first_rho=-0.397,
    new_tokens=Q((1.0, 9.0, 53.0, 131.0, 249.0, 383.0, 612.0, 974.7, 1664.0, 3301.8, 5691.7, 14538.5,
                  146409.0)),
    output=Q((0.0, 110.0, 136.0, 161.0, 196.0, 240.0, 300.0, 391.0, 538.0, 910.5, 1429.5, 3452.8, 18195.0)),
    think_tool=Q((0.0, 5.0, 6.0, 7.0, 8.0, 9.0, 12.0, 16.0, 23.0, 66.0, 133.0, 927.6, 3696.0)),
    think_user=Q((3.0, 22.0, 34.6, 49.0, 73.0, 114.0, 171.0, 264.0, 519.4, 1935.4, 3172.6, 3572.68, 36236.0)),
    user_turn_prob=0.259,
    rewrite_prob=0.071,
    rewrite_keep=Q((0.0, 0.104, 0.169, 0.991, 0.998, 0.999, 0.999, 0.999, 0.999, 1.0, 1.0, 1.0, 1.0)),
    rewrite_new=Q((159.0, 328.7, 443.8, 679.2, 912.8, 1357.0, 2343.0, 8522.2, 49608.6, 89567.7, 117335.55,
                   202104.69, 697351.0)),
    peak_context=Q((14383.0, 69563.5, 101125.0, 129530.5, 139616.0, 145603.0, 150283.0, 155538.0, 221896.0,
                    317181.5, 544743.75, 873361.45, 881443.0)),
    start_delay=0.0,
)
_SUB_THINK = Q((1.0, 2.0, 3.0, 3.0, 3.0, 4.0, 4.0, 5.0, 6.0, 23.6, 41.85, 63.78, 65.0))
SUB = AgentShape(
    prefix_tokens=8437,
    first_context=Q((2475.0, 2483.4, 2783.4, 3233.2, 3269.6, 3287.0, 3296.8, 3306.6, 3318.8, 3452.3, 3599.65,
                     3717.53, 3747.0)),
    turns=Q((4.0, 4.7, 5.8, 7.0, 7.0, 7.0, 7.8, 10.6, 11.6, 13.5, 15.25, 16.65, 17.0)),
    turns_first_rho=0.23,
    new_tokens=Q((25.0, 267.6, 688.4, 1292.5, 2274.6, 3001.5, 3452.8, 4916.0, 7100.4, 16540.1, 50061.6,
                  58314.41, 58728.0)),
    output=Q((80.0, 132.9, 145.6, 172.7, 187.6, 208.0, 240.4, 292.0, 336.6, 1836.3, 2964.7, 4423.02, 4797.0)),
    think_tool=_SUB_THINK,
    think_user=_SUB_THINK,  # (#)
    user_turn_prob=0.0,
    rewrite_prob=0.032,
    rewrite_keep=Q((0.999,) * 13),  # (#)
    rewrite_new=Q((6861.0,) * 6 + (13304.0,) * 7),  # (#)
    peak_context=Q((53136.0, 60465.7, 67103.4, 72429.6, 73000.8, 76750.0, 80788.0, 82370.0, 88377.6, 93665.4,
                    95337.7, 96675.54, 97010.0)),
    start_delay=0.69,
)
DEFAULT = SyntheticConfig(
    main=MAIN,
    sub=SUB,
    subagent_prob=0.000724,
    subagents_per_group=Q((1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.4, 1.8, 2.2, 2.6, 2.8, 2.96, 3.0)),
)
# fmt: on

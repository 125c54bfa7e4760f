

# profiles: model-based baselines
add_profile(Profile("rl", "static", "random", "lyapunov", "RL: random routing + Lyapunov deployment"))
add_profile(Profile("al", "static", "uniform", "lyapunov", "AL: uniform routing over feasible nodes + Lyapunov"))
add_profile(Profile("perllm", "static", "perllm-ucb", "lyapunov", "PerLLM: UCB routing bandit + Lyapunov deployment"))
# end model-based profiles

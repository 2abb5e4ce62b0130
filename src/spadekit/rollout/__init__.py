"""Rollouts: multi-turn episodes between a policy and environments, token-exact.

Layer 4: rollout.
May import: common, envs, sandbox, policy.

``engine`` plays batches of episodes, keeping every sampled token id, mask and behaviour logprob;
``local_env`` and ``ray_envs`` run environments in this process or on Ray actors behind one
session interface; ``ray_reaper`` kills what a local Ray instance leaves behind; ``thinking``
splits a thinking model's reasoning from its action. Knows nothing of designers, rewards or
rounds: ``spadekit.selfplay`` drives it.
"""

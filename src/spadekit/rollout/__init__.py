"""Rollouts: multi-turn episodes between a policy and environments, token-exact.

Layer 4: rollout.
May import: common, envs, sandbox, policy.

- ``engine``: ``RolloutEngine`` plays batches of episodes (one ``policy.generate`` call per turn
  across all live episodes), keeps every turn's token ids, mask and behaviour logprobs so the
  trainer sees exactly what was sampled (no re-tokenisation drift), and caps turns and context.
- ``local_env``: environments in this process (library games, trusted code) behind the same
  session interface as sandboxed ones.
- ``ray_envs``: the same interface on Ray actors (``pip install "spadekit[ray]"``; Ray is imported
  only when a Ray backend is built).
- ``ray_reaper``: the watchdog that kills a local Ray instance the backend started once the
  process that started it is gone, however it died.
- ``thinking``: splitting a thinking model's reasoning from its action.

Knows nothing of designers, rewards or rounds: ``spadekit.selfplay`` drives it.
"""

"""Adapters that host spadekit inside other training frameworks (slime: the paper's backbone).

Layer 7: integrations.
May import: common, envs, sandbox, runs, policy, rollout, train, eval, curriculum, selfplay.

``slime``: the SPADE round as slime's rollout function (``python -m spadekit.integrations.slime``);
``slime_samples`` converts spadekit samples to slime's. Ray-hosted environments, which every
backend can use, live in ``spadekit.rollout.ray_envs``.
"""

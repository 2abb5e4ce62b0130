"""Adapters that host spadekit inside other training frameworks (slime: the paper's backbone).

Layer 7: integrations.
May import: common, envs, sandbox, runs, policy, rollout, train, eval, curriculum, selfplay.

``slime``: the SPADE round as slime's rollout function (``python -m spadekit.integrations.slime``);
``slime_samples`` converts spadekit samples to slime's. ``gym_pool``: a pool's programs as
Gymnasium ids; ``trl``: a pool's environments as TRL ``GRPOTrainer``'s ``environment_factory``
(``PoolEnvironments``; ``examples/trl_pool.py``). Ray-hosted environments, which every
backend can use, live in ``spadekit.rollout.ray_envs``.
"""

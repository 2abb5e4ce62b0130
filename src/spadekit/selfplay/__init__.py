"""The SPADE algorithm: one policy as Environment Designer and Reasoning Agent (SPEC.md).

Layer 6: selfplay.
May import: common, envs, sandbox, runs, policy, rollout, train, eval, curriculum.

One round (``loop.SelfPlay.round``, Algorithm 1 of the paper): design (``design``, ``prompts``,
``corpus``, ``memory``), validate (``spadekit.sandbox.validate``, optional ``repair``/``judge``),
hint, play (``spadekit.rollout``, spot-checked by ``watch``), reward (``rewards``), advantages
(``advantages``, ``samples``), update (``spadekit.train``), checkpoint (``spadekit.runs``).
``config`` is the run's config tree (presets in ``presets/``); ``distributed`` places the same
round on several processes; ``generate`` is the offline designer. Overview: docs/design/selfplay.md.
"""

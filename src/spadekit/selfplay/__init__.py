"""The SPADE algorithm: one policy as Environment Designer and Reasoning Agent (SPEC.md).

Layer 6: selfplay.
May import: common, envs, sandbox, runs, policy, rollout, train, eval, curriculum.

One round (``loop.SelfPlay.round``, Algorithm 1 of the paper): design (``design``, ``prompts``,
``corpus``, ``memory``), validate (``spadekit.sandbox.validate``, optional ``repair``/``judge``),
hint, play (``spadekit.rollout``, spot-checked by ``watch``), reward (``rewards``), advantages
(``advantages``, ``samples``), update (``spadekit.train``), checkpoint (``spadekit.runs``).
``config`` is the run's config tree (presets in ``presets/``); each step declares where it runs on
several processes (``distributed.placed``); the run's parts are one ``setup.RunParts``;
``generate`` is the offline designer. Overview: docs/design/selfplay.md.
"""

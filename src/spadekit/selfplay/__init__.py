"""The SPADE algorithm: one policy as Environment Designer and Reasoning Agent (SPEC.md).

Layer 6: selfplay.
May import: common, envs, sandbox, runs, policy, rollout, train, eval, curriculum.

One round (``loop.SelfPlay.round``, Algorithm 1 of the paper), each step a named call:

1. design (``design``, prompts in ``prompts``, grounding documents from ``corpus``, kept in
   the run directory by ``corpus_pin`` so a resume grounds on the same ones, seeds from
   ``memory``): the policy writes environment programs plus hints;
2. validate: the staged checks of ``spadekit.sandbox.validate``, with ``repair`` and ``judge``
   as optional extras;
3. hint: the same policy reads each valid program and writes its privileged hint;
4. play: the agent plays every pooled environment, without and with the hint
   (``spadekit.rollout``), while ``watch`` spot-checks admitted programs for reward hacking;
5. reward (``rewards``): the agent's return; the designer's hint regret blended with the
   difficulty anchor, delayed ``regen_interval`` rounds;
6. advantages (``advantages``, ``samples``): GRPO per role, the designer upweighted;
7. update: one GRPO step of the shared weights (``spadekit.train``);
8. checkpoint: weights and run state to the run directory (``spadekit.runs``).

``config`` is the one dataclass tree of a run (presets in ``presets/``); each step declares where it
runs under several processes (``distributed.placed``); the run's parts are one
``setup.RunParts``; ``generate`` is the offline designer (``spadekit generate``).
"""

"""Training of the one SPADE policy in both roles: the GRPO loss with clip-higher, truncated
importance sampling for the delayed designer update and the optional low-variance KL
(``spadekit.train.loss``), and the trainer around it.

Layer 4: train.
May import: common, policy.
"""

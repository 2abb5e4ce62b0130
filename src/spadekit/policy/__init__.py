"""Policies: one protocol (``spadekit.policy.base``), several backends (``registry``).

Layer 3: policy.
May import: common.

Import-light: nothing here imports torch; backends load it when a model is built.
"""

from spadekit.policy.base import (Generation, GenerationRequest, Policy, PolicyError,
                                  SamplingParams)
from spadekit.policy.registry import load_policy, register_backend

__all__ = ["Generation", "GenerationRequest", "Policy", "PolicyError", "SamplingParams",
           "load_policy", "register_backend"]

"""The text-environment contract: program records, action parsers, the tool-use base class.

Layer 1: envs.
May import: common.

Standard library only (sandbox workers import this package). The gymnasium adapter lives in
``spadekit.sandbox.gym_adapter`` and is imported explicitly, never from here.
"""

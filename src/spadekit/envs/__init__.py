"""The text-environment contract: program records, action parsers, the tool-use base class.

Standard library only (sandbox workers import this package). The gymnasium adapter lives in
``spadekit.envs.gym_adapter`` and is imported explicitly, never from here.
"""

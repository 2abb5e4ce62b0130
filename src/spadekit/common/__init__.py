"""Shared plumbing with no SPADE knowledge: the typed errors of every boundary (``errors``),
crash-safe JSONL appends and bounded reads (``jsonl``), the one decoder of JSON spadekit did not
write (``safe_json``), safe rendering of untrusted text (``safe_text``), greedy grouping of
padded rows under a budget (``packing``), the CPUs a process may use (``cpus``) and the declared
config fields every config section uses (``config_fields``, on pydantic).

Layer 0: common.
May import: nothing.

Standard library only, but ``config_fields`` (pydantic, a core dependency); sandbox workers load
``common.errors`` alone.
"""

"""Shared plumbing with no SPADE knowledge: the typed errors of every boundary (``errors``),
crash-safe JSONL appends and bounded reads (``jsonl``), the one decoder of JSON spadekit did not
write (``safe_json``), safe rendering of untrusted text (``safe_text``), greedy grouping of
padded rows under a budget (``packing``) and the CPUs a process may use (``cpus``).

Layer 0: common.
May import: nothing.

Standard library only (sandbox workers load ``common.errors``).
"""

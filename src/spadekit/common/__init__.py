"""Shared plumbing with no SPADE knowledge: the typed errors of every boundary (``errors``),
crash-safe JSONL appends (``jsonl``) and safe rendering of untrusted text (``safe_text``).

Layer 0: common.
May import: nothing.

Standard library only (sandbox workers load ``common.errors``).
"""

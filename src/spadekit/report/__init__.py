"""The run report: a read-only view of a run directory (``data``) for the dashboard and the
self-contained HTML report.

Layer 5: report.
May import: common, runs.
"""

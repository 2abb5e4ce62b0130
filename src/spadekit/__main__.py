"""``python -m spadekit``: the same command line as ``spadekit``."""

from spadekit.cli import main

main()

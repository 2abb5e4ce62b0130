"""Adapters that host spadekit inside other training frameworks (slime, Ray).

``ray_envs``: sandboxed environments and validation on Ray actors (``pip install
"spadekit[ray]"``); Ray is imported only when a Ray backend is built.
"""

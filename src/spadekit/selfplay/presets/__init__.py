"""Configuration presets (YAML) for ``spadekit selfplay --preset NAME``."""

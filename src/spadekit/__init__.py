"""spadekit: self-play RL of language models in environments the model writes itself (SPADE).

This top-level module must stay import-light and standard-library-only: sandbox workers put the
package on their path so that model-written programs can use ``spadekit.envs`` helpers.
"""

__version__ = "0.1.0"

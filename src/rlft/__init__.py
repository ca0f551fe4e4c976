"""rlft: reinforcement-learning fine-tuning of language models.

Shape legend used across the package: B batch, G (or k) samples per prompt, T tokens, V vocab.
"""

__version__ = "0.1.0"

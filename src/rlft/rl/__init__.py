"""Parts of the RL loop (:mod:`rlft.recipes.rl`): options (config), prompt sources (prompts), rewards, sampling a
step's groups (sampling), group filtering (groups), sample batches and the loss's backward (batch), step metrics
(metrics). Nothing here imports :mod:`rlft.recipes`."""

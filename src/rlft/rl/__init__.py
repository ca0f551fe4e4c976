"""Parts of the RL loop (:mod:`rlft.recipes.rl`): options (config), the records the parts pass each other (records: a
prompt, the reward, a sampled step; a leaf), prompt sources (prompts), rewards, sampling a step's groups (sampling),
group filtering (groups), reward shaping (shaping), the curriculum (curriculum), sample batches and the loss's backward
(batch), step metrics and the run's totals (metrics). Nothing here imports :mod:`rlft.recipes`."""

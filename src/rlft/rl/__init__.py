"""Parts of the RL loop (:mod:`rlft.recipes.rl`): options (config), the records the parts pass each other (records: a
prompt, the reward, a sampled step, an update; a leaf), prompt sources (prompts), rewards, sampling a step's groups
(sampling), group filtering (groups), reward shaping (shaping), the curriculum (curriculum), off-policy reuse (reuse,
over the replay buffer of replay), a step's log-probs in one place (logprobs), sample batches and the loss's backward
(batch), step metrics and their sums over ranks (metrics), the in-loop evaluation and its test looks (evaluation), and
the rank helpers (ranks). Nothing here imports :mod:`rlft.recipes`."""

"""Parts of the RL loop: prompt sources, rewards, sample batches, group filtering."""

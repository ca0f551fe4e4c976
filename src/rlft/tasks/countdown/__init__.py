"""The Countdown task: generator, solver, reasoning traces, prompts and dataset loaders."""

"""Console output: one rich console, logging through it, and a progress bar for training loops."""

from __future__ import annotations

import logging

from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console(stderr=True)


def setup_logging(level: int = logging.INFO) -> None:
    """Route the ``rlft`` logger through rich; quiet the noisy third-party loggers."""
    logger = logging.getLogger("rlft")
    if not any(isinstance(h, RichHandler) for h in logger.handlers):
        logger.addHandler(RichHandler(console=console, show_path=False, markup=False))
    logger.setLevel(level)
    logger.propagate = False
    for name in ("transformers", "accelerate", "datasets", "httpx"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        import transformers

        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    except Exception:  # transformers missing or changed: not worth failing over
        pass


def training_progress(description: str) -> Progress:
    """A progress bar whose ``info`` field shows live metrics (loss, tokens/s, ...); hidden on ranks
    other than 0 under torchrun."""
    from rlft.distributed import is_main

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
        transient=False,
        disable=not is_main(),
    )

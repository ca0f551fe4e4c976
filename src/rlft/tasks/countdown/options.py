"""Where a command's Countdown tasks come from: the option blocks ``sft``, ``pairs countdown``, ``eval countdown`` and
``rl``/``rloo`` share, and the one definition of the held-out split they all read.

- :class:`CountdownOptions`: ``--preset``, ``--split-seed``, ``--heldout-size``, ``--prompt-template``,
  ``--data-split`` (all four; :meth:`CountdownOptions.generated_tasks` is the generated train/held-out split);
- :class:`CountdownDataOptions`: ``--data``, a Countdown file or Hub dataset instead of generated tasks
  (:meth:`CountdownDataOptions.row_split`: its fixed held-out rows; eval countdown, pairs countdown, rl). The held-out
  block follows the data: ``pool.parquet`` (recognised by its rows) has the fresh 1,000 test + 1,000 validation
  rows, any other file the original 500 + 500 (:mod:`rlft.tasks.countdown.splits`), so ``--data <pool.parquet>
  --split test`` reads the fresh test rows and ``rl --data <pool.parquet>`` trains on the pool's other rows;
- :class:`CountdownTrainingOptions`: ``--data-heldout`` (pairs countdown, rl), and
  :meth:`CountdownTrainingOptions.training_tasks`, the tasks a training command may use.

"Evaluation never sees a training task" rests on these: every command draws generated tasks through
:meth:`CountdownOptions.generated_tasks` (:func:`rlft.tasks.countdown.generator.make_splits`: the held-out tasks come
first, from their own seed stream, and training tasks equal to one are redrawn), and rows of a dataset through
:func:`rlft.tasks.countdown.splits.load_split`. With equal ``--preset``, ``--split-seed`` and ``--heldout-size``
(the defaults are equal) no training task is among the first ``--heldout-size`` held-out tasks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlft.types import CountdownTask

if TYPE_CHECKING:
    from rlft.tasks.countdown.splits import RowSplit

COUNTDOWN_NAME_FIELDS = ("preset", "prompt_template", "trace_style")
"""Option fields whose values name a Countdown preset, prompt template or trace style."""


def _choices(name: str) -> list[str]:
    if name == "preset":
        from rlft.tasks.countdown.generator import PRESETS

        return sorted(PRESETS)
    if name == "prompt_template":
        from rlft.tasks.countdown.prompts import PROMPT_TEMPLATES

        return sorted(PROMPT_TEMPLATES)
    from rlft.tasks.countdown.traces import TRACE_STYLES

    return list(TRACE_STYLES)


def check_countdown_names(cfg) -> None:
    """Check the fields of ``cfg`` named in :data:`COUNTDOWN_NAME_FIELDS` (those it has) against the registries of
    :mod:`rlft.tasks.countdown`: ``--preset`` (``generator.PRESETS``), ``--prompt-template``
    (``prompts.PROMPT_TEMPLATES``), ``--trace-style`` (``traces.TRACE_STYLES``).

    Raises:
        OptionError: e.g. ``--preset: expected one of 'cog_behav', 'easy3', ..., got 'hard'``.
    """
    from rlft.validation import OptionError, flag

    for name in COUNTDOWN_NAME_FIELDS:
        value = getattr(cfg, name, None)
        if isinstance(value, str) and value not in _choices(name):
            raise OptionError(f"{flag(name)}: expected one of {', '.join(map(repr, _choices(name)))}, got {value!r}")


DEFAULT_NUM_TRAIN = 2000
"""Generated training tasks of ``rlft sft`` and ``rlft rl`` by default (``--num-train``)."""


@dataclass(frozen=True)
class CountdownOptions:
    """``--preset``, ``--split-seed``, ``--heldout-size``, ``--prompt-template``, ``--data-split``: generated Countdown
    tasks and their held-out split (:meth:`generated_tasks`), and how a task is rendered as a prompt."""

    data_split: str = "train"
    """Split to read when --data is a Hub dataset id (Countdown-Tasks-3to4 has only 'train')."""
    preset: str = "easy3"
    """Countdown generator preset of generated tasks, training and held-out alike (easy3, medium3, standard,
    cog_behav, tiny); tasks read from a file (--data) do not use it."""
    split_seed: int = 1234
    """Seed of the generated train/held-out split (rlft.tasks.countdown.generator.make_splits); keep it equal across
    sft, pairs countdown, rl and eval countdown."""
    heldout_size: int = 200
    """Generated tasks held out from training: the first N of the held-out stream of --preset and --split-seed,
    which no training task equals (keep it equal across commands; `rlft eval countdown --split test` evaluates at most
    this many, a larger --limit is refused). Not used with --data, whose held-out rows are fixed."""
    prompt_template: str = "base"
    """Countdown prompt template: 'base' (TinyZero), 'chat' (the tokenizer's chat template), 'short' (compact), 'calc'
    ('base' telling of a calculator tool, for --trace-style calc)."""

    def generated_tasks(self, n_train: int,
                        n_heldout: int | None = None) -> tuple[list[CountdownTask], list[CountdownTask]]:
        """``(train, heldout)``: the first ``n_train`` generated training tasks and the first ``n_heldout`` (None:
        ``heldout_size``) held-out tasks of ``--preset`` with ``--split-seed``: ``make_splits(PRESETS[preset],
        n_train, heldout_size, split_seed)``. The held-out stream is prefix-stable and does not depend on
        ``n_train``, and no training task equals one of the first ``heldout_size`` held-out tasks.

        Raises:
            ValueError: an unknown preset; ``n_heldout`` larger than ``heldout_size`` (those tasks are not held out).
        """
        from rlft.tasks.countdown.generator import PRESETS, make_splits

        if self.preset not in PRESETS:
            raise ValueError(f"unknown Countdown preset {self.preset!r}; choose from {sorted(PRESETS)}")
        n_heldout = self.heldout_size if n_heldout is None else n_heldout
        if n_heldout > self.heldout_size:
            raise ValueError(f"{n_heldout} held-out tasks asked for, but --heldout-size is {self.heldout_size}: "
                             "the tasks past it are not held out from training")
        # with no training tasks the held-out prefix alone is drawn (the same tasks, prefix-stable)
        train, heldout = make_splits(PRESETS[self.preset], n_train, self.heldout_size if n_train else n_heldout,
                                     self.split_seed)
        return train, heldout[:n_heldout]

    def _check_countdown(self) -> None:
        """Checks across the Countdown options (``calc`` traces need the ``calc`` prompt, which tells of the tool), and
        their preset and template names (:func:`check_countdown_names`)."""
        from rlft.validation import require

        check_countdown_names(self)
        require(getattr(self, "trace_style", None) != "calc" or self.prompt_template == "calc",
                "--trace-style calc needs --prompt-template calc (the prompt that tells the model of the calculator)")
        data = getattr(self, "data", None)
        require(self.data_split == "train" or isinstance(data, str),
                f"--data-split {self.data_split} is only read with --data (a Hub dataset id)")


@dataclass(frozen=True)
class CountdownDataOptions(CountdownOptions):
    """``--data``: Countdown tasks from a file or Hub dataset, with its fixed held-out rows (:meth:`row_split`), or
    (None) generated tasks (and the options of :class:`CountdownOptions`)."""

    data: str | None = None
    """None: generated tasks of --preset (split by --split-seed and --heldout-size); else a Countdown
    .jsonl/.json/.parquet file or Hub dataset with target + nums/numbers (e.g. countdown-3to4: the 10,240
    Countdown-Tasks-3to4 rows that ship with rlft; Jiayi-Pan/Countdown-Tasks-3to4), split by
    rlft.tasks.countdown.splits into training rows and a held-out block
    that never trains: 500 validation + 500 test rows (the 'original' block; its test rows are now a development set),
    or for ../shared/data/countdown/pool.parquet (recognised by its rows) 1,000 fresh validation + 1,000 fresh test
    rows, the rest its training pool."""

    def row_split(self) -> "RowSplit":
        """The train / validation / test rows of ``--data`` (:func:`rlft.tasks.countdown.splits.load_split`)."""
        from rlft.tasks.countdown.splits import load_split

        if self.data is None:
            raise ValueError("row_split needs --data (a Countdown file or Hub dataset)")
        return load_split(self.data, data_split=self.data_split)

    def heldout_block(self) -> str | None:
        """The name of ``--data``'s held-out block, ``'original'`` or ``'fresh'`` (:func:`rlft.tasks.countdown.splits.
        block_of`: reads the rows); None for generated tasks. The test-look ledger records it (``heldout``).

        Raises:
            rlft.data.files.DataError: a malformed row.
        """
        from rlft.tasks.countdown.loaders import load_countdown
        from rlft.tasks.countdown.splits import FRESH_POOL_ROWS, block_of

        if self.data is None:
            return None
        return block_of(load_countdown(self.data, split=self.data_split, limit=FRESH_POOL_ROWS + 1)).name


@dataclass(frozen=True)
class CountdownTrainingOptions(CountdownDataOptions):
    """``--data-heldout``: whether a dataset's held-out rows stay out of training (and :class:`CountdownDataOptions`);
    :meth:`training_tasks` are the tasks a training command may use."""

    data_heldout: bool = True
    """With --data: hold its validation and test rows out of training (rlft.tasks.countdown.splits). Off
    (--no-data-heldout): the file's rows in order, none held out (a small file with no held-out block; rl then
    evaluates nothing in the loop)."""

    def training_tasks(self, n: int, *, start: int = 0, heldout: str = "validation"
                       ) -> tuple[list[CountdownTask], list[CountdownTask]]:
        """``(train, heldout)``: training tasks ``start .. start + n`` and the held-out tasks.

        Generated (``data`` None): :meth:`generated_tasks` (``start + n`` training tasks, ``heldout_size`` held out).
        From ``data``: its training rows (:meth:`row_split`; rows equal to a held-out row never train) and its
        ``heldout`` part ('validation' or 'test'); with ``data_heldout`` off, its rows ``start .. start + n`` in file
        order and no held-out tasks.

        Raises:
            ValueError: an unknown preset; rlft.data.files.DataError: a malformed row.
        """
        if self.data is None:
            train, held = self.generated_tasks(start + n)
            return train[start:], held
        if not self.data_heldout:
            from rlft.tasks.countdown.loaders import load_countdown

            return load_countdown(self.data, split=self.data_split, start=start, limit=n), []
        split = self.row_split()
        return split.train[start : start + n], split.part(heldout)

    def _check_countdown(self) -> None:
        from rlft.validation import require

        super()._check_countdown()
        require(self.data is not None or self.data_heldout,
                "--no-data-heldout is only read with --data (generated tasks always hold --heldout-size tasks out)")

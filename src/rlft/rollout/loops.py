"""Loop-aware stopping: a completion that has written the same line N times is stopped there.

A policy that loops (``"7+58=65, 65-7=58, no.\\n"`` again and again, the Countdown searches of
``docs/results/countdown-real/``) would otherwise run to ``max_new_tokens``, and a batch waits for its longest row.
:attr:`rlft.rollout.base.SamplingParams.stop_repeats` = N (opt-in) stops a row right after the newline that completes
the N-th occurrence of one line; the row is marked ``Sample.looped`` and keeps ``finish_reason == "length"``
(no EOS: it counts as truncated everywhere ``"length"`` is read, e.g. the truncation penalty and ``--mask-truncated``;
it has no answer, so scoring is unchanged).

Definitions (shared by the decoders and the offline measurement ``scripts/studies/loop_stop_study.py``):

- a *line* is the text between two newlines of the decoded completion (special tokens skipped); only complete lines
  count (the text after the last newline is still being written);
- two lines are *identical* when they are equal after stripping surrounding whitespace; whitespace-only lines never
  count.

The decoders call :meth:`LoopStop.looped` only on steps whose token contains a newline
(:attr:`LoopStop.trigger_ids`), so a row pays one decode of its completion per line written. Engines that cannot
stop a row early (vLLM, an OpenAI-compatible server) cut each finished sample where the stop would have ended it
(:meth:`LoopStop.apply`): the same samples, no time saved.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from rlft.rollout.base import Sample

_IDS_CONTAINING: dict[tuple[int, str], tuple[object, frozenset[int]]] = {}  # (id(tokenizer), text) -> (tokenizer, ids)


def loop_cut(text: str, repeats: int) -> int | None:
    """Where ``text`` stops under ``stop_repeats=repeats``: the index just after the newline that ends the
    ``repeats``-th occurrence of an identical non-empty line (so ``text[:cut]`` is what the decoder keeps), or None
    when no complete line occurs ``repeats`` times.

    Raises:
        ValueError: ``repeats < 2``.
    """
    if repeats < 2:
        raise ValueError(f"repeats must be >= 2, got {repeats}")
    counts: Counter[str] = Counter()
    start = 0
    while (end := text.find("\n", start)) != -1:
        line = text[start:end].strip()
        start = end + 1
        if line:
            counts[line] += 1
            if counts[line] >= repeats:
                return start
    return None


def token_ids_containing(tokenizer, text: str) -> frozenset[int]:
    """The ids (of ``len(tokenizer)``) whose decoded text contains ``text``; computed once per tokenizer object and
    text (the decoders' triggers: a newline for the loop stop, ``>`` for a tool call's end)."""
    key = (id(tokenizer), text)
    cached = _IDS_CONTAINING.get(key)
    if cached is not None and cached[0] is tokenizer:
        return cached[1]
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=True)
    ids = frozenset(i for i, decoded in enumerate(texts) if text in decoded)
    _IDS_CONTAINING[key] = (tokenizer, ids)
    return ids


def newline_token_ids(tokenizer) -> frozenset[int]:
    """The ids (of ``len(tokenizer)``) whose decoded text contains a newline; computed once per tokenizer object."""
    return token_ids_containing(tokenizer, "\n")


class LoopStop:
    """The per-row test the decoders run: has a completion (token ids) written an identical non-empty line
    ``repeats`` times (:func:`loop_cut` on its decoded text)?"""

    def __init__(self, tokenizer, repeats: int):
        """Raises ValueError: ``repeats < 2``."""
        if repeats < 2:
            raise ValueError(f"stop_repeats must be >= 2, got {repeats}")
        self.tokenizer = tokenizer
        self.repeats = repeats
        self.trigger_ids = newline_token_ids(tokenizer)
        """Only a step that emits one of these can complete a line: the decoders test no other step."""

    def looped(self, token_ids: list[int]) -> bool:
        """True when the decoded ``token_ids`` contain ``repeats`` identical complete non-empty lines."""
        return loop_cut(self.tokenizer.decode(token_ids, skip_special_tokens=True), self.repeats) is not None

    def cut(self, token_ids: list[int]) -> int | None:
        """The number of tokens a decoder with this stop keeps of an already generated row (the step whose token
        completed the ``repeats``-th identical line, plus one), or None when the row never loops. For decoders that
        cannot stop a row early (transformers ``generate``): same ids, no tokens saved."""
        for t, token in enumerate(token_ids):
            if token in self.trigger_ids and self.looped(token_ids[: t + 1]):
                return t + 1
        return None

    def apply(self, sample: Sample) -> Sample:
        """``sample`` cut where this stop would have ended it (ids, log-probs and text; ``finish_reason`` "length",
        ``looped`` True), or ``sample`` itself when it never loops. ``self_certainty`` (a mean over the uncut
        tokens) is dropped from a cut sample."""
        cut = self.cut(sample.completion_ids)
        if cut is None:
            return sample
        ids = sample.completion_ids[:cut]
        return replace(sample, completion_ids=ids, text=self.tokenizer.decode(ids, skip_special_tokens=True),
                       finish_reason="length", looped=True,
                       logprobs=None if sample.logprobs is None else sample.logprobs[:cut], self_certainty=None)


def stop_loops(samples: list[list[Sample]], tokenizer, repeats: int | None) -> list[list[Sample]]:
    """``samples`` (B lists of k) with each one cut by :meth:`LoopStop.apply` (``repeats``: ``stop_repeats``; None:
    ``samples`` unchanged). For engines that generate each sample whole (vLLM, an OpenAI-compatible server)."""
    if repeats is None:
        return samples
    stop = LoopStop(tokenizer, repeats)
    return [[stop.apply(s) for s in row] for row in samples]

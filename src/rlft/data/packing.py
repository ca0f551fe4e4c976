"""Padding-free packing: several tokenized sequences concatenated into one row, no padding between them.

A packed row carries ``position_ids`` that restart at 0 at every sequence start and **no**
``attention_mask``. From those position ids transformers (>= 4.56; read in 5.x
``masking_utils.find_packed_sequence_indices`` and ``modeling_flash_attention_utils._is_packed_sequence``)
keeps attention inside each sequence:

- ``flash_attention_2``/``flash_attention_3`` (CUDA): the varlen kernel, with ``cu_seqlens`` taken from
  the positions where ``position_ids == 0``. It needs the whole micro-batch in ONE row, which is what
  ``pack_length=None`` gives;
- ``sdpa`` and ``eager`` (CPU, or CUDA without flash-attn): an exact 4-D block-diagonal causal mask built
  by ``create_causal_mask``. Its cost grows with the square of the row length, so on CPU pack into rows
  of bounded length (``pack_length``).

Either way each token sees exactly the tokens of its own sequence, at the positions it would have
unpacked, so packed log-probs equal padded ones up to float rounding (``tests/unit/test_packing.py``).

The first token of every sequence must not be a loss target (it would be scored from the previous
sequence's last token): :func:`pack_examples` raises if it is.

Shape legend: N sequences, R packed rows, L row length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlft.data.tokenize import TokenizedExample


@dataclass
class PackedBatch:
    """N sequences packed into R right-padded rows of length L (padding only at the end of a row)."""

    input_ids: torch.Tensor  # (R, L) long
    position_ids: torch.Tensor  # (R, L) long, 0 at every sequence start (and at the start of the row's padding)
    loss_mask: torch.Tensor  # (R, L) float, 1 on target tokens
    sequence_index: torch.Tensor  # (R, L) long, the sequence (0..N-1) each token belongs to, -1 on padding
    last_index: torch.Tensor  # (N,) long, flat index r * L + t of each sequence's last token

    @property
    def num_sequences(self) -> int:
        return int(self.last_index.shape[0])

    @property
    def num_tokens(self) -> int:
        """Real (non-padding) tokens."""
        return int((self.sequence_index >= 0).sum())

    def to(self, device: torch.device | str) -> "PackedBatch":
        return PackedBatch(*(t.to(device) for t in (self.input_ids, self.position_ids, self.loss_mask,
                                                    self.sequence_index, self.last_index)))


def plan_rows(lengths: list[int], pack_length: int | None) -> list[list[int]]:
    """Which sequences go in which row: first-fit decreasing (longest first, each into the first row with
    room for it, ties in index order) into rows of at most ``pack_length`` tokens; a sequence longer than
    ``pack_length`` gets a row of its own. ``pack_length=None``: everything in one row, in order.

    With ``pack_length`` = the longest sequence this never needs more rows than right padding does (each
    row holds at least one sequence), so no row is longer than a padded one and there are no more of them.

    Raises:
        ValueError: ``pack_length < 1``.
    """
    if pack_length is None:
        return [list(range(len(lengths)))]
    if pack_length < 1:
        raise ValueError(f"pack_length must be >= 1 (or None for one row), got {pack_length}")
    rows: list[list[int]] = []
    used: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        r = next((r for r, u in enumerate(used) if u + lengths[i] <= pack_length), None)
        if r is None:
            rows.append([])
            used.append(0)
            r = len(rows) - 1
        rows[r].append(i)
        used[r] += lengths[i]
    return rows


def default_pack_length(model, lengths: list[int]) -> int | None:
    """The row length ``--packing`` uses when ``--pack-length`` is not set.

    - flash-attention (``config._attn_implementation`` contains "flash"): None, one row (its varlen kernel
      costs the same however the tokens are split, and wants one row);
    - anything else (SDPA, eager: a dense block-diagonal mask whose cost grows with the square of the row):
      the longest sequence, so packed rows are never longer, nor more, than padded ones.
    """
    implementation = str(getattr(getattr(model, "config", None), "_attn_implementation", "") or "")
    return None if "flash" in implementation else max(lengths)


def pack_examples(examples: list[TokenizedExample], pad_token_id: int, pack_length: int | None = None) -> PackedBatch:
    """Pack ``examples`` into rows (see :func:`plan_rows`); sequence ``i`` of the result is ``examples[i]``.

    Raises:
        ValueError: no examples, an empty example, a sequence whose first token is a loss target, or
            ``pack_length < 1``.
    """
    if not examples:
        raise ValueError("cannot pack an empty list of examples")
    for i, e in enumerate(examples):
        if not e.input_ids:
            raise ValueError(f"example {i} has no tokens")
        if e.loss_mask[0]:
            raise ValueError(f"example {i}: its first token is a loss target, which packing cannot score "
                             "(it would be predicted from the previous sequence)")
    rows = plan_rows([len(e.input_ids) for e in examples], pack_length)
    width = max(sum(len(examples[i].input_ids) for i in row) for row in rows)
    shape = (len(rows), width)
    input_ids = torch.full(shape, pad_token_id, dtype=torch.long)
    position_ids = torch.zeros(shape, dtype=torch.long)
    loss_mask = torch.zeros(shape, dtype=torch.float32)
    sequence_index = torch.full(shape, -1, dtype=torch.long)
    last_index = torch.zeros(len(examples), dtype=torch.long)
    for r, row in enumerate(rows):
        t = 0
        for i in row:
            e = examples[i]
            n = len(e.input_ids)
            input_ids[r, t : t + n] = torch.tensor(e.input_ids)
            position_ids[r, t : t + n] = torch.arange(n)
            loss_mask[r, t : t + n] = torch.tensor(e.loss_mask, dtype=torch.float32)
            sequence_index[r, t : t + n] = i
            last_index[i] = r * width + t + n - 1
            t += n
        position_ids[r, t:] = torch.arange(width - t)  # padding: one more "sequence", never a target
    return PackedBatch(input_ids, position_ids, loss_mask, sequence_index, last_index)


def sequence_sums(values: torch.Tensor, batch: PackedBatch, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per-sequence sums of ``values * mask`` out of packed rows.

    Args:
        values: ``(R, L)`` per-token values (e.g. log-probs; 0 off the mask is not required).
        mask: ``(R, L)``, default ``batch.loss_mask``.
    Returns:
        ``(N,)`` float: ``out[i] = sum of values * mask over the tokens of sequence i`` (differentiable).
    """
    mask = batch.loss_mask if mask is None else mask
    masked = torch.where(mask != 0, values * mask, 0.0).flatten()
    index = batch.sequence_index.flatten().clamp(min=0)  # padding has mask 0, so index 0 receives 0 from it
    return torch.zeros(batch.num_sequences, dtype=masked.dtype, device=masked.device).index_add(0, index, masked)

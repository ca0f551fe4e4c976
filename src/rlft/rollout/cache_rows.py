"""The continuous batch's KV cache (:func:`rlft.rollout.refill.decode_jobs`): rows appended, a freed row refilled in
place, leading padding columns trimmed, in buffers with spare columns written in place."""

from __future__ import annotations

import functools

import torch


SPARE = 64
"""Free columns a cache buffer is (re)allocated with: a layer copies its cache once per SPARE steps."""


@functools.cache
def _layer_class():
    """:class:`transformers.DynamicLayer` whose keys and values are views of buffers with :data:`SPARE` free columns at
    the end: a step writes its token's key and value in place, where ``DynamicLayer`` concatenates (a copy of the
    whole cache at every step, 13% of a 64-row CPU decoding step of SmolLM2-135M)."""
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        def __init__(self, keys: torch.Tensor, values: torch.Tensor):
            super().__init__()
            self.set(keys, values)

        def set(self, keys: torch.Tensor, values: torch.Tensor) -> None:
            """Hold ``keys``/``values`` ``(B, H, L, D)`` (copied into new buffers with SPARE free columns)."""
            b, h, n, d = keys.shape
            self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
            self.k_buffer = keys.new_empty((b, h, n + SPARE, d))
            self.v_buffer = values.new_empty((b, h, n + SPARE, values.shape[-1]))
            self.k_buffer[:, :, :n], self.v_buffer[:, :, :n] = keys, values
            self.view(n)

        def view(self, n: int) -> None:
            self.length = n
            self.keys, self.values = self.k_buffer[:, :, :n], self.v_buffer[:, :, :n]

        def update(self, key_states, value_states, *args, **kwargs):
            n = key_states.shape[-2]
            if self.length + n > self.k_buffer.shape[2]:
                self.set(self.keys, self.values)
            self.k_buffer[:, :, self.length : self.length + n] = key_states
            self.v_buffer[:, :, self.length : self.length + n] = value_states
            self.view(self.length + n)
            return self.keys, self.values

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            self.k_buffer, self.v_buffer = self.k_buffer[indices], self.v_buffer[indices]
            self.view(self.length)

        def trim(self, first: int) -> None:
            """Drop the first ``first`` columns (views: no copy)."""
            self.k_buffer, self.v_buffer = self.k_buffer[:, :, first:], self.v_buffer[:, :, first:]
            self.view(self.length - first)

    return GrowingLayer


def append_rows(cache, mask: torch.Tensor | None, kvs: list[list[tuple[torch.Tensor, torch.Tensor]]],
                 lengths: list[int], device) -> tuple[object, torch.Tensor]:
    """Append rows whose prompt KV (per layer ``(1, H, P, D)``) is ``kvs`` to ``cache`` (None: start one), left-padded
    with zeros to the common width (the old rows are padded on the left when a new prompt is wider; padding holds
    finite values, as masked attention multiplies them by 0). Returns the cache and the ``(B, L)`` mask of its
    columns."""
    from transformers import DynamicCache

    old_width = 0 if mask is None else mask.shape[1]
    width = max(old_width, *lengths)
    new_mask = torch.zeros((len(kvs), width), dtype=torch.long, device=device)
    for r, n in enumerate(lengths):
        new_mask[r, width - n :] = 1
    stacked = []
    for layer in range(len(kvs[0])):
        k0, v0 = kvs[0][layer]
        keys = k0.new_zeros((len(kvs), k0.shape[1], width, k0.shape[3]))
        values = v0.new_zeros((len(kvs), v0.shape[1], width, v0.shape[3]))
        for r, n in enumerate(lengths):
            keys[r, :, width - n :] = kvs[r][layer][0][0]
            values[r, :, width - n :] = kvs[r][layer][1][0]
        stacked.append((keys, values))
    if cache is None:
        cache = DynamicCache()
        cache.layers = [_layer_class()(keys, values) for keys, values in stacked]
        return cache, new_mask
    grow = width - old_width
    for layer, (keys, values) in zip(cache.layers, stacked):
        old_k, old_v = layer.keys, layer.values
        if grow:
            old_k = torch.cat([old_k.new_zeros((*old_k.shape[:2], grow, old_k.shape[3])), old_k], dim=2)
            old_v = torch.cat([old_v.new_zeros((*old_v.shape[:2], grow, old_v.shape[3])), old_v], dim=2)
        layer.set(torch.cat([old_k, keys]), torch.cat([old_v, values]))
    if grow:
        mask = torch.cat([mask.new_zeros((mask.shape[0], grow)), mask], dim=1)
    return cache, torch.cat([mask, new_mask])


def fill_row(cache, mask: torch.Tensor, row: int, kv: list[tuple[torch.Tensor, torch.Tensor]], length: int) -> None:
    """Write a prompt's KV (per layer ``(1, H, P, D)``, ``P = length`` <= the cache's width ``L``) into the last ``P``
    columns of batch row ``row`` of ``cache``, in place, and make ``mask[row]`` ``(L,)`` 0 before them, 1 on them.
    The columns left of the prompt keep the finished row's values: finite, and masked."""
    width = mask.shape[1]
    mask[row] = 0
    mask[row, width - length :] = 1
    for layer, (keys, values) in zip(cache.layers, kv):
        layer.keys[row, :, width - length :] = keys[0]
        layer.values[row, :, width - length :] = values[0]


def trim(cache, mask: torch.Tensor) -> torch.Tensor:
    """Cut the leading cache columns that are padding in every row; returns the trimmed mask."""
    first = int(mask.any(dim=0).int().argmax())
    if first == 0:
        return mask
    for layer in cache.layers:
        layer.trim(first)
    return mask[:, first:]

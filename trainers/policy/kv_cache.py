"""A KV cache written in place: the sampler's decode steps copy one new position per layer, never the cache.

transformers' `DynamicLayer` grows by `torch.cat` (every step copies the whole cache of every layer),
and the prefix-tree sampler this replaces also reordered it every step (`batch_select_indices`): two
full copies per decode step. `GrowingLayer` holds a buffer with room for the positions to come, writes
each step's keys and values into it, and hands attention a view of the filled part, so a step costs
what its new position costs. The buffer grows by doubling (one copy, rarely) up to the longest
sequence the sampler can produce, so a large `max_new_tokens` reserves nothing up front.

    preallocate(cache, rows, longest)   the prefilled cache's layers, rows picked (a prompt's G rows), as
                                        GrowingLayers; False (cache untouched) when a layer is another kind
                                        (sliding windows, quantized): the caller keeps the plain cache
"""

from __future__ import annotations

from transformers.cache_utils import DynamicLayer  # this module is imported by the sampler only, lazily

FIRST_ROOM = 64  # positions reserved past the prompt at first (doubled when used up)


def preallocate(cache, rows, longest: int) -> bool:
    """Replace each DynamicLayer of `cache` by a GrowingLayer holding its `rows` (a batch index)."""
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer or not layer.is_initialized for layer in layers):
        return False
    for index, layer in enumerate(layers):
        layers[index] = GrowingLayer(layer.keys[rows], layer.values[rows], longest)
    return True


class GrowingLayer(DynamicLayer):
    """A DynamicLayer whose keys and values live in a buffer written in place (see the module docstring)."""

    def __init__(self, keys, values, longest: int):
        super().__init__()
        self.length, self.longest = keys.shape[-2], longest
        self.device, self.is_initialized = keys.device, True
        self._keys = _room(keys, min(longest, self.length + FIRST_ROOM))
        self._values = _room(values, self._keys.shape[-2])
        self._views()

    def _views(self) -> None:
        self.keys, self.values = self._keys[:, :, :self.length], self._values[:, :, :self.length]

    def update(self, key_states, value_states, *args, **kwargs):
        """Write the new positions in place; return the filled part (what attention reads)."""
        end = self.length + key_states.shape[-2]
        if end > self._keys.shape[-2]:  # out of room: double (never past the longest possible sequence)
            capacity = max(end, min(self.longest, 2 * self._keys.shape[-2]))
            self._keys, self._values = _room(self.keys, capacity), _room(self.values, capacity)
        self._keys[:, :, self.length:end].copy_(key_states)
        self._values[:, :, self.length:end].copy_(value_states)
        self.length = end
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        """Positions filled so far."""
        return self.length

    def batch_select_indices(self, indices) -> None:
        """Keep the rows `indices` (one copy of the buffers)."""
        self._keys, self._values = self._keys[indices], self._values[indices]
        self._views()


def _room(tensor, capacity: int):
    """A (batch, heads, capacity, dim) buffer starting with `tensor`."""
    buffer = tensor.new_empty((*tensor.shape[:2], capacity, tensor.shape[-1]))
    buffer[:, :, :tensor.shape[-2]].copy_(tensor)
    return buffer

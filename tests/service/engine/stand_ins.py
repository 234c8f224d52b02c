"""What a BatchEngine stand-in that runs its batches one at a time needs beside its own `run`: a batch is its items
(an item's len() is its tokens), with their sizes and no padding; nothing to release; no error is an out-of-memory
one. test_device_runners.py and test_in_order.py build their stand-ins on it."""

from __future__ import annotations


class StandInEngine:
    overlaps = False
    pads_attention = False

    def collate(self, items):
        class Batch:
            size = len(items)
            real_tokens = padded_tokens = sum(len(i) for i in items)
            flops, padding_flops = 1.0, 0.0
        batch = Batch()
        batch.items = items
        return batch

    def release_cached_memory(self) -> None:
        pass

    @staticmethod
    def is_out_of_memory(exc: BaseException) -> bool:
        return False

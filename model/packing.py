"""The packed (padding-free) layout of a batch of sequences of different lengths."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch


@dataclass
class Packing:
    """B sequences of different lengths laid out without padding: their N real tokens back to back.

    Every layer but attention works token by token, so embeddings, projections, feed-forward and
    LayerNorm (nearly all the FLOPs of short inputs) run on the N real tokens only. Attention works
    sequence by sequence: on CPU it usually runs on each sequence's own `spans` of the packed layout;
    on CUDA in half precision FlashAttention reads the packed layout itself, given `cu_seqlens` (see
    model.attention); otherwise each layer scatters q/k/v into the padded (B, T) layout and gathers it back.

    Every token of a sequence attends to its first `key_lengths` tokens (all of them unless given): a ColBERT query's
    [MASK] expansion tokens read the query, and the query does not read them (as its attention mask says in
    transformers).

    `spare_rows` rows may follow the last sequence (`model.row_buckets`: a bfloat16 batch on a CPU is computed on a
    rounded-up row count). They hold no token: attention gives them zeros and no sequence reads them.
    """

    indices: torch.Tensor  # (N,) where each real token sits in the flattened (B*T) padded layout
    rows: torch.Tensor  # (N,) which sequence each token belongs to
    positions: torch.Tensor  # (N,) each token's position within its sequence
    starts: torch.Tensor  # (B,) where each sequence starts in the packed layout (its [CLS])
    key_mask: torch.Tensor | None  # (B, 1, 1, T) boolean SDPA mask, None when all lengths are equal
    batch: int
    width: int
    spans: tuple[tuple[int, int], ...]  # (start, length) of each sequence in the packed layout
    cu_seqlens: torch.Tensor  # (B+1,) int32: 0, then where each sequence ends (FlashAttention's varlen form)
    # Where some sequence's last tokens are no keys: how many tokens of each are keys, the packed rows of those keys
    # (K,) and their cumulative counts (B+1,) int32. None when every token is a key.
    key_lengths: tuple[int, ...] | None = None
    key_rows: torch.Tensor | None = None
    cu_keys: torch.Tensor | None = None
    spare_rows: int = 0

    @classmethod
    def from_lengths(cls, lengths: list[int], keys: list[int] | None = None, spare_rows: int = 0) -> Packing:
        """`keys`: how many leading tokens of each sequence are attended to (None: all); `spare_rows`: rows computed
        after the last sequence's."""
        # Built with numpy, then shared with torch: on these small arrays each torch op costs a few us more
        # (the batcher builds one Packing per batch, on the thread that must stay ahead of the device).
        sizes = np.asarray(lengths, dtype=np.int64)
        width = int(sizes.max())
        ends = np.cumsum(sizes)
        starts = ends - sizes
        rows = np.repeat(np.arange(len(sizes)), sizes)
        positions = np.arange(int(ends[-1])) - starts[rows]
        attended = sizes if keys is None else np.asarray(keys, dtype=np.int64)
        key_mask = None
        if int(sizes.min()) != width or keys is not None:
            key_mask = torch.from_numpy((np.arange(width)[None, :] < attended[:, None])[:, None, None, :])
        spans = tuple(zip(starts.tolist(), sizes.tolist()))
        cu_seqlens = np.concatenate(([0], ends)).astype(np.int32)
        restricted = {}
        if keys is not None:
            key_rows = np.flatnonzero(positions < attended[rows])
            restricted = dict(key_lengths=tuple(map(int, attended)), key_rows=torch.from_numpy(key_rows),
                              cu_keys=torch.from_numpy(np.concatenate(([0], np.cumsum(attended))).astype(np.int32)))
        return cls(torch.from_numpy(rows * width + positions), torch.from_numpy(rows), torch.from_numpy(positions),
                   torch.from_numpy(starts), key_mask, len(lengths), width, spans, torch.from_numpy(cu_seqlens),
                   **restricted, spare_rows=spare_rows)

    @property
    def max_length(self) -> int:
        """The longest sequence's length (FlashAttention's max_seqlen; the padded layout's width)."""
        return self.width

    @cached_property
    def lengths(self) -> torch.Tensor:
        """(B,) int64: each sequence's length."""
        return torch.tensor([length for _, length in self.spans], dtype=torch.int64)

    @cached_property
    def real_squares(self) -> int:
        return sum(n * n for _, n in self.spans)

    def attend_each_on_cpu(self, hidden: int) -> bool:
        """On CPU, whether one attention call per sequence (on its span) costs less than one padded call, for
        attention `hidden` wide (heads x head size)."""
        return self.key_mask is not None and attends_each_on_cpu(self.batch, self.width, self.real_squares, hidden)

    def to(self, device: torch.device, non_blocking: bool = False) -> Packing:
        if device.type == "cpu":  # built on the CPU: nothing to move (five no-op copies cost tens of us a batch)
            return self
        move = lambda t: None if t is None else t.to(device, non_blocking=non_blocking)  # noqa: E731
        return Packing(move(self.indices), move(self.rows), move(self.positions), move(self.starts),
                       move(self.key_mask), self.batch, self.width, self.spans, move(self.cu_seqlens),
                       self.key_lengths, move(self.key_rows), move(self.cu_keys), self.spare_rows)

    @cached_property
    def tokens(self) -> int:
        """N: the real tokens, the packed layout's rows before any spare ones."""
        return sum(length for _, length in self.spans)

    def with_spare_rows(self, packed: torch.Tensor) -> torch.Tensor:
        """(N,) ids, types or positions -> (N + spare rows,), zeros after the tokens' ([PAD], type 0, position 0)."""
        return torch.nn.functional.pad(packed, (0, self.spare_rows)) if self.spare_rows else packed

    def real_rows(self, computed: torch.Tensor) -> torch.Tensor:
        """The tokens' rows of a tensor computed with the spare rows (a view)."""
        return computed[: self.tokens] if self.spare_rows else computed

    def pad(self, packed: torch.Tensor) -> torch.Tensor:
        """(N, D) -> (B, T, D), zeros where there is no token (spare rows are dropped)."""
        packed = self.real_rows(packed)
        if self.key_mask is None:  # equal lengths: the packed layout is the padded one
            return packed.view(self.batch, self.width, -1)
        padded = packed.new_zeros(self.batch * self.width, packed.shape[-1]).index_copy(0, self.indices, packed)
        return padded.view(self.batch, self.width, -1)

    def unpad(self, padded: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (N, D), and zeros in the spare rows."""
        if self.key_mask is None:
            packed = padded.reshape(self.batch * self.width, -1)
        else:
            packed = padded.reshape(self.batch * self.width, -1).index_select(0, self.indices)
        return torch.cat((packed, packed.new_zeros(self.spare_rows, packed.shape[-1]))) if self.spare_rows else packed


def attends_each_on_cpu(count: int, longest: int, real_squares: int, hidden: int = 384) -> bool:
    """Whether, on CPU, attention over `count` sequences (the longest `longest` tokens, their squared
    lengths summing to `real_squares`) `hidden` wide costs less as one call per sequence than as one
    padded call.

    CPU attention of one (L, L) sequence costs about 10 us + 0.026 us * L^2 on one core at 384 wide (12
    heads of 32; the L^2 part grows with the width), each call from Python about 8 us more; so, in units
    of 0.026 us and with r = hidden / 384, a padded call over B rows of width T costs B * (400 + r T^2)
    and the per-sequence calls sum(700 + r L^2). Short sequences of nearly equal lengths, and narrow
    models, stay in one call; typical mixed batches of wide models split.
    """
    r = hidden / 384
    return 700 * count + r * real_squares < count * (400 + r * longest * longest)

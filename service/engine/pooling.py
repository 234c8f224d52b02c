"""One vector per sequence from an encoder's token states: its [CLS] token's, or the mean over its tokens, L2-normalised
or not (what /encode, OpenAI's and TEI's embeddings ask for). The eager heads pool the variants a batch's items ask
for; a CUDA graph pools every variant inside the replay, so that an embedding batch's launch is its input copy, its
replay and its output copy. On a GPU each torch call of a launch gives up the interpreter and may wait for another
thread to hand it back (service/engine/interpreter_lag.py); pooling, normalising and converting outside the graph
took about ten such calls a batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# The variants a graph computes, in the order of its pooled output's first dimension.
POOLED = (("cls", False), ("cls", True), ("mean", False), ("mean", True))


def pool(states: torch.Tensor, mode: str, rows: torch.Tensor, ends: torch.Tensor, starts: torch.Tensor
         ) -> torch.Tensor:
    """(B, H) float32 states (N, H) pooled per sequence by `mode` ("cls" or "mean"). `rows` (N,): each row's
    sequence, or B for a row of none (a graph's padding, whose values may be anything, NaN included: they are summed
    into a row that is then dropped, never multiplied away); `ends` (B + 1,) the cumulative lengths; `starts` (B,)
    each sequence's first row. An empty sequence (a graph's unused slot) pools to zeros."""
    if mode == "cls":
        return states[starts]
    count = starts.shape[0]
    sums = states.new_zeros(count + 1, states.shape[-1]).index_add_(0, rows, states)[:count]
    lengths = (ends[1:] - ends[:-1]).clamp_min(1).to(states.dtype)
    return sums / lengths[:, None]


def pool_every_variant(states: torch.Tensor, rows: torch.Tensor, ends: torch.Tensor, starts: torch.Tensor,
                       out: torch.Tensor) -> torch.Tensor:
    """Every variant of POOLED into `out` (len(POOLED), B, H), for a padded batch: `rows` (N,) may name any sequence
    for the rows at or past `ends[-1]` (padding), which are counted in none."""
    real = torch.arange(rows.shape[0], device=rows.device) < ends[-1]
    rows = torch.where(real, rows, starts.shape[0])
    pooled = {mode: pool(states, mode, rows, ends, starts) for mode in ("cls", "mean")}
    return torch.stack([F.normalize(pooled[mode], dim=-1) if normalize else pooled[mode] for mode, normalize in POOLED],
                       out=out)

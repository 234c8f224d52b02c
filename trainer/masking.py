"""Dynamic masked-LM masking, drawn afresh each time a batch is used."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from model.tokenizer import WordPieceTokenizer


@dataclass
class MaskedBatch:
    input_ids: torch.Tensor  # (B, T) with masked positions rewritten
    positions: torch.Tensor  # (B, T) bool: the chosen positions
    labels: torch.Tensor  # (N,) original ids at the chosen positions, row-major


def mask_tokens(
    input_ids: torch.Tensor,
    special_mask: torch.Tensor,
    generator: torch.Generator,
    mask_id: int,
    replacement_pool: torch.Tensor,
    rate: float = 0.15,
) -> MaskedBatch:
    """Choose round(rate x real tokens) positions per sequence (at least one), never a special
    token; of those, 80% become [MASK], 10% a random token, 10% stay as they are (Devlin et al.)."""
    candidates = ~special_mask
    per_row = candidates.sum(dim=1)
    to_choose = torch.clamp(torch.round(per_row.float() * rate).long(), min=1)
    to_choose = torch.minimum(to_choose, per_row)
    # A random key per token, specials pushed last; the k smallest keys of a row are chosen.
    keys = torch.rand(input_ids.shape, generator=generator)
    keys = keys.masked_fill(special_mask, 2.0)
    ranks = keys.argsort(dim=1).argsort(dim=1)
    positions = (ranks < to_choose[:, None]) & candidates

    labels = input_ids[positions]
    action = torch.rand(labels.shape, generator=generator)
    random_tokens = replacement_pool[torch.randint(len(replacement_pool), labels.shape, generator=generator)]
    replaced = torch.where(action < 0.8, torch.full_like(labels, mask_id), labels)
    replaced = torch.where((action >= 0.8) & (action < 0.9), random_tokens, replaced)
    masked = input_ids.clone()
    masked[positions] = replaced
    return MaskedBatch(masked, positions, labels)


def replaceable_ids(tokenizer: WordPieceTokenizer, vocab_size: int) -> torch.Tensor:
    """Token ids a masked position may be replaced with at random: anything but the specials."""
    ids = torch.arange(vocab_size)
    return ids[~torch.isin(ids, torch.tensor(sorted(tokenizer.special_ids)))]

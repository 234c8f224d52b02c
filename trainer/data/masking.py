"""Dynamic masked-LM masking, drawn afresh each time a batch is used."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from model.tokenizer import WordPieceTokenizer
from trainer.data.examples import pad_columns


# The loss's ignore_index (F.cross_entropy's default): the label of a slot that holds no chosen position.
NO_LABEL = -100


@dataclass
class MaskedBatch:
    input_ids: torch.Tensor  # (B, T) with masked positions rewritten
    positions: torch.Tensor  # (B, T) bool: the chosen positions
    labels: torch.Tensor  # (N,) original ids at the chosen positions, row-major
    # For a step of fixed shapes (`in_slots`): (B, S) each row's chosen positions, then 0 ([CLS]) in the spare slots,
    # and (B, S) their labels, NO_LABEL in the spare slots. None for a step whose shapes follow the batch.
    slots: torch.Tensor | None = None
    slot_labels: torch.Tensor | None = None

    def padded_to(self, width: int, pad_id: int) -> "MaskedBatch":
        """The same masks over pairs padded on to `width` tokens (`PairBatch.padded_to`)."""
        return MaskedBatch(pad_columns(self.input_ids, width, pad_id), pad_columns(self.positions, width, False),
                           self.labels)


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


def slots_per_row(max_seq_len: int, rate: float) -> int:
    """The most positions `mask_tokens` chooses in one pair of `max_seq_len` tokens (its [CLS] and two [SEP] are
    never chosen): the same float32 rounding, at the most candidates a row can have. 19 for 128 tokens at 15%."""
    return max(1, int(torch.round(torch.tensor(float(max_seq_len - 3)) * rate)))


def in_slots(masked: MaskedBatch, slots: int) -> MaskedBatch:
    """`masked` with its chosen positions also in `slots` fixed places a row (`MaskedBatch.slots`), so that a step
    can gather them without asking the device how many there are: the rows' chosen positions in order, then [CLS]
    (position 0) with NO_LABEL in the spare places, which the loss ignores and which therefore get no gradient."""
    counts = masked.positions.sum(1)
    if int(counts.max()) > slots:
        raise ValueError(f"a row has {int(counts.max())} masked positions, more than its {slots} slots")
    chosen_first = torch.argsort((~masked.positions).to(torch.int8), dim=1, stable=True)[:, :slots]
    filled = torch.arange(slots)[None, :] < counts[:, None]  # (B, S), row-major in the order `labels` has
    slot_labels = torch.full(filled.shape, NO_LABEL, dtype=masked.labels.dtype)
    slot_labels[filled] = masked.labels
    return MaskedBatch(masked.input_ids, masked.positions, masked.labels, torch.where(filled, chosen_first, 0),
                       slot_labels)


def replaceable_ids(tokenizer: WordPieceTokenizer, vocab_size: int) -> torch.Tensor:
    """Token ids a masked position may be replaced with at random: anything but the specials."""
    ids = torch.arange(vocab_size)
    return ids[~torch.isin(ids, torch.tensor(sorted(tokenizer.special_ids)))]

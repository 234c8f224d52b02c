"""How a batch runs on the device. Knows nothing of queues, deadlines or HTTP.

One forward pass of the encoder serves every item of a batch; each item then gets only its own head:
token vectors or pooling (/encode), the MLM head at its [MASK] positions only (/fill-mask), the
pooler and NSP head on its [CLS] (/nsp).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from model.bert import BertForPreTraining, Packing, packed_batch_flops

log = logging.getLogger("service")
Task = Literal["encode", "fill_mask", "nsp"]


@dataclass
class Item:
    """One input of one request, tokenized."""

    input_ids: list[int]
    token_type_ids: list[int]
    task: Task
    pooling: Literal["none", "cls", "mean"] = "none"
    normalize: bool = False
    top_k: int = 5
    target_ids: list[int] | None = None
    mask_positions: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class Batch:
    """Plain data on the host: the items' tokens packed back to back (no padding), and the items."""

    input_ids: torch.Tensor  # (N,) every item's tokens, one item after another
    token_type_ids: torch.Tensor  # (N,)
    packing: Packing
    items: list[Item]

    @property
    def padded_tokens(self) -> int:
        """Tokens in attention's padded (B, T) layout; the token-wise layers compute `real_tokens` only."""
        return self.packing.batch * self.packing.width

    @property
    def real_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def real_square_tokens(self) -> int:
        """Sum of squared lengths: the (query, key) pairs attention needs."""
        return sum(len(i) ** 2 for i in self.items)

    def starts(self) -> list[int]:
        """Where each item begins in the packed layout."""
        return list(accumulate((len(i) for i in self.items[:-1]), initial=0))


@dataclass
class MaskResult:
    position: int
    token_ids: np.ndarray  # (k,) best first
    scores: np.ndarray  # (k,) softmax over the whole vocabulary


@dataclass
class ItemResult:
    vectors: np.ndarray | None = None  # (L, H) token vectors or (H,) pooled, float32
    masks: list[MaskResult] | None = None
    nsp_logits: np.ndarray | None = None  # (2,)


def pick_device(choice: str) -> torch.device:
    if choice == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(choice)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {choice} asked for, but CUDA is not available")
    return device


def plan_compute(concurrent_batches: int, device: torch.device) -> int:
    """How many batches run at once; on CPU, also splits torch's threads between them."""
    if device.type != "cpu":
        return concurrent_batches or 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    batches = concurrent_batches or (2 if cores >= 2 else 1)
    torch.set_num_threads(max(1, cores // batches))
    return batches


def pick_dtype(choice: str, device: torch.device) -> torch.dtype:
    if choice != "auto":
        return getattr(torch, choice)
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


class Engine:
    def __init__(self, model: BertForPreTraining, pad_id: int, device: torch.device, dtype: torch.dtype):
        self.model = model.to(device=device, dtype=dtype).eval()
        self.pad_id = pad_id
        self.device = device
        self.dtype = dtype
        self.hidden_size = model.config.hidden_size

    @property
    def has_mlm_head(self) -> bool:
        return self.model.has_mlm_head

    def flops(self, count: int, longest: int, real: int, real_squares: int) -> tuple[float, float]:
        """(FLOPs of one packed batch, the part spent on padding): see `packed_batch_flops`."""
        return packed_batch_flops(self.model.config, count, longest, real, real_squares)

    @property
    def has_nsp_head(self) -> bool:
        return self.model.has_nsp_head

    def collate(self, items: list[Item]) -> Batch:
        ids = torch.tensor([t for item in items for t in item.input_ids], dtype=torch.long)
        types = torch.tensor([t for item in items for t in item.token_type_ids], dtype=torch.long)
        packing = Packing.from_lengths([len(item) for item in items])
        if self.device.type == "cuda":  # page-locked memory: the copy overlaps with the host
            ids, types = ids.pin_memory(), types.pin_memory()
        return Batch(ids, types, packing, items)

    @torch.inference_mode()
    def run(self, batch: Batch) -> list[ItemResult]:
        device = self.device
        ids = batch.input_ids.to(device, non_blocking=True)
        types = batch.token_type_ids.to(device, non_blocking=True)
        packing = batch.packing.to(device, non_blocking=True)
        hidden = self.model.bert.forward_packed(ids, types, packing)  # (N, H): real tokens only
        results = [ItemResult() for _ in batch.items]
        starts = batch.starts()
        self._encode_outputs(batch, hidden, packing, starts, results)
        self._fill_mask_outputs(batch, hidden, starts, results)
        self._nsp_outputs(batch, hidden, starts, results)
        return results

    # ---- heads ---------------------------------------------------------------------------------

    def _encode_outputs(self, batch: Batch, hidden: torch.Tensor, packing: Packing, starts: list[int],
                        results: list[ItemResult]) -> None:
        rows = [r for r, item in enumerate(batch.items) if item.task == "encode"]
        if not rows:
            return
        hidden = hidden.float()
        wanted = {(batch.items[r].pooling, batch.items[r].normalize) for r in rows}
        host: dict[tuple[str, bool], np.ndarray] = {}  # only the variants some item asked for reach the host
        for pooling, normalize in wanted:
            if pooling == "none":
                values = hidden  # (N, H): every item's token vectors, split per item below
            elif pooling == "cls":
                values = hidden[packing.starts]  # (B, H)
            else:
                lengths = torch.tensor([len(i) for i in batch.items], device=hidden.device, dtype=hidden.dtype)
                sums = hidden.new_zeros(packing.batch, hidden.shape[-1]).index_add_(0, packing.rows, hidden)
                values = sums / lengths[:, None]  # (B, H): mean over the item's tokens
            host[(pooling, normalize)] = (F.normalize(values, dim=-1) if normalize else values).cpu().numpy()
        for row in rows:
            item = batch.items[row]
            values = host[(item.pooling, item.normalize)]
            results[row].vectors = values[starts[row] : starts[row] + len(item)] if item.pooling == "none" else values[row]

    def _fill_mask_outputs(self, batch: Batch, hidden: torch.Tensor, starts: list[int],
                           results: list[ItemResult]) -> None:
        wanted = [(r, p) for r, item in enumerate(batch.items) if item.task == "fill_mask" for p in item.mask_positions]
        if not wanted:
            return
        at = torch.tensor([starts[r] + p for r, p in wanted], device=hidden.device)
        logits = self.model.cls.predictions(hidden[at]).float()  # (M, V): masked positions only
        probs = torch.softmax(logits, dim=-1)
        k = max((batch.items[r].top_k for r, _ in wanted), default=1)
        top_scores, top_ids = probs.topk(min(k, probs.shape[-1]), dim=-1)  # on the device: only k values move
        top_scores, top_ids = top_scores.cpu().numpy(), top_ids.cpu().numpy()
        target_rows = [slot for slot, (r, _) in enumerate(wanted) if batch.items[r].target_ids]
        target_probs = probs[target_rows].cpu().numpy() if target_rows else None
        target_lookup = {slot: n for n, slot in enumerate(target_rows)}
        for slot, (row, position) in enumerate(wanted):
            item = batch.items[row]
            if item.target_ids:
                scores = target_probs[target_lookup[slot]][item.target_ids]
                order = np.argsort(-scores, kind="stable")[: item.top_k]
                ids = np.asarray(item.target_ids)[order]
                mask_result = MaskResult(position, ids, scores[order])
            else:
                mask_result = MaskResult(position, top_ids[slot, : item.top_k], top_scores[slot, : item.top_k])
            if results[row].masks is None:
                results[row].masks = []
            results[row].masks.append(mask_result)

    def _nsp_outputs(self, batch: Batch, hidden: torch.Tensor, starts: list[int], results: list[ItemResult]) -> None:
        rows = [r for r, item in enumerate(batch.items) if item.task == "nsp"]
        if not rows:
            return
        cls_vectors = hidden[torch.tensor([starts[r] for r in rows], device=hidden.device)][:, None]  # (R, 1, H)
        logits = self.model.cls.seq_relationship(self.model.bert.pooler(cls_vectors)).float().cpu().numpy()
        for slot, row in enumerate(rows):
            results[row].nsp_logits = logits[slot]

    def release_cached_memory(self) -> None:
        """Give the allocator's cached blocks back after an out-of-memory error, before retrying smaller."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def warm_up(self, cls_id: int, sep_id: int, mask_id: int) -> None:
        """One batch through every head, so the first client request pays no first-call costs."""
        items = [Item([cls_id, mask_id, sep_id], [0, 0, 0], "encode", pooling="mean"),
                 Item([cls_id, mask_id, sep_id, mask_id, sep_id], [0, 0, 0, 1, 1], "encode")]
        if self.has_mlm_head:
            items.append(Item([cls_id, mask_id, sep_id], [0, 0, 0], "fill_mask", mask_positions=[1]))
        if self.has_nsp_head:
            items.append(Item([cls_id, mask_id, sep_id, mask_id, sep_id], [0, 0, 0, 1, 1], "nsp"))
        self.run(self.collate(items))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()

"""How a batch runs on the device. Knows nothing of queues, deadlines or HTTP.

One forward pass of the encoder serves every item of a batch; each item then gets only its own head:
token vectors or pooling (/encode), the MLM head at its [MASK] positions only (/fill-mask), the
pooler and NSP head on its [CLS] (/nsp).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from model.bert import BertForPreTraining, key_padding_mask

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
    """Plain data: padded tensors on the host, and the items they came from."""

    input_ids: torch.Tensor  # (B, T)
    token_type_ids: torch.Tensor  # (B, T)
    attention_mask: torch.Tensor  # (B, T)
    items: list[Item]

    @property
    def padded_tokens(self) -> int:
        return self.input_ids.numel()

    @property
    def real_tokens(self) -> int:
        return sum(len(i) for i in self.items)


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

    @property
    def has_nsp_head(self) -> bool:
        return self.model.has_nsp_head

    def collate(self, items: list[Item]) -> Batch:
        width = max(len(i) for i in items)
        ids = torch.full((len(items), width), self.pad_id, dtype=torch.long)
        types = torch.zeros((len(items), width), dtype=torch.long)
        mask = torch.zeros((len(items), width), dtype=torch.long)
        for row, item in enumerate(items):
            n = len(item)
            ids[row, :n] = torch.tensor(item.input_ids)
            types[row, :n] = torch.tensor(item.token_type_ids)
            mask[row, :n] = 1
        if self.device.type == "cuda":  # page-locked memory: the copy overlaps with the host
            ids, types, mask = ids.pin_memory(), types.pin_memory(), mask.pin_memory()
        return Batch(ids, types, mask, items)

    @torch.inference_mode()
    def run(self, batch: Batch) -> list[ItemResult]:
        device = self.device
        ids = batch.input_ids.to(device, non_blocking=True)
        types = batch.token_type_ids.to(device, non_blocking=True)
        mask = batch.attention_mask.to(device, non_blocking=True)
        bert = self.model.bert
        hidden = bert.encoder(bert.embeddings(ids, types), key_padding_mask(mask))  # (B, T, H)
        results = [ItemResult() for _ in batch.items]
        self._encode_outputs(batch, hidden, mask, results)
        self._fill_mask_outputs(batch, hidden, results)
        self._nsp_outputs(batch, hidden, results)
        return results

    # ---- heads ---------------------------------------------------------------------------------

    def _encode_outputs(self, batch: Batch, hidden: torch.Tensor, mask: torch.Tensor, results: list[ItemResult]) -> None:
        rows = [r for r, item in enumerate(batch.items) if item.task == "encode"]
        if not rows:
            return
        index = torch.tensor(rows, device=hidden.device)
        selected = hidden.index_select(0, index).float()  # (R, T, H)

        def vectors(pooling: str, normalize: bool) -> np.ndarray:
            if pooling == "cls":
                values = selected[:, 0]  # (R, H)
            elif pooling == "mean":
                lengths = mask.index_select(0, index)[..., None]  # (R, T, 1)
                values = (selected * lengths).sum(1) / lengths.sum(1)  # (R, H)
            else:
                values = selected  # (R, T, H)
            return (F.normalize(values, dim=-1) if normalize else values).cpu().numpy()

        # Only the variants some item asked for are computed and copied to the host.
        host = {variant: vectors(*variant) for variant in {(batch.items[r].pooling, batch.items[r].normalize) for r in rows}}
        for slot, row in enumerate(rows):
            item = batch.items[row]
            values = host[(item.pooling, item.normalize)][slot]
            results[row].vectors = values[: len(item)] if item.pooling == "none" else values

    def _fill_mask_outputs(self, batch: Batch, hidden: torch.Tensor, results: list[ItemResult]) -> None:
        wanted = [(r, p) for r, item in enumerate(batch.items) if item.task == "fill_mask" for p in item.mask_positions]
        if not wanted:
            return
        rows = torch.tensor([r for r, _ in wanted], device=hidden.device)
        cols = torch.tensor([p for _, p in wanted], device=hidden.device)
        logits = self.model.cls.predictions(hidden[rows, cols]).float()  # (M, V): masked positions only
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

    def _nsp_outputs(self, batch: Batch, hidden: torch.Tensor, results: list[ItemResult]) -> None:
        rows = [r for r, item in enumerate(batch.items) if item.task == "nsp"]
        if not rows:
            return
        index = torch.tensor(rows, device=hidden.device)
        cls_vectors = hidden.index_select(0, index)[:, :1]  # the pooler reads position 0
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

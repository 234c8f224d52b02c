"""The pre-training forward pass: MLM logits at the masked positions, NSP logits, and (for
--preserve-embeddings) the mean-pooled sentence vectors, computed with as little work as each needs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from model.bert import BertForPreTraining, key_padding_mask, rows_at
from trainer.data.masking import NO_LABEL
from trainer.options import VECTOR_SOURCES, TrainOptions
from trainer.placement import Placement


def mean_pooled(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T, H) -> (B, H): the mean over real tokens, special tokens included (sentence-transformers' rule)."""
    weights = attention_mask.to(hidden.dtype).unsqueeze(-1)  # (B, T, 1)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)


# The clean first segments are cut to this many tokens: passages as long as the retention probe's sentences
# (trainer.retention), and half a training pair, so the term's extra forward and backward stay cheap.
CLEAN_MAX_TOKENS = 64


def first_segments(input_ids: torch.Tensor, token_type_ids: torch.Tensor, attention_mask: torch.Tensor, sep_id: int,
                   max_tokens: int = CLEAN_MAX_TOKENS, fixed_width: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Each pair's `[CLS] A [SEP]` alone, as users embed a passage, A cut to fit `max_tokens`:
    (ids (B, W), attention mask (B, W)), W <= max_tokens; W = max_tokens (or the pairs' width) if `fixed_width`.

    Segment B's tokens may remain past a row's end; the mask hides them from attention and from the mean."""
    mask = attention_mask * (token_type_ids == 0)
    lengths = mask.sum(1)
    width = min(input_ids.shape[1] if fixed_width else int(lengths.max()), max_tokens)
    ids, mask = input_ids[:, :width].clone(), mask[:, :width]
    ids[lengths > width, width - 1] = sep_id  # a cut segment still ends as a passage does
    return ids, mask


def vector_inputs(source: str, input_ids: torch.Tensor, token_type_ids: torch.Tensor, attention_mask: torch.Tensor,
                  mlm_positions: torch.Tensor, clean: tuple[torch.Tensor, torch.Tensor] | None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the preservation term's sentence vectors embed and average, for the model and the frozen encoder
    alike: (ids, token types, attention mask, pooling mask). `source` is --preserve-over: the training pair as it
    is ("all"), the same without the predicted positions ("unmasked"), or the `first_segments` given as `clean`."""
    if source == "clean":
        if clean is None:
            raise ValueError('sentence vectors of "clean" need the first segments (`clean`)')
        ids, mask = clean
        return ids, torch.zeros_like(ids), mask, mask
    pooled = attention_mask * ~mlm_positions if source == "unmasked" else attention_mask
    return input_ids, token_type_ids, attention_mask, pooled


def pretraining_logits(model: BertForPreTraining, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                       attention_mask: torch.Tensor, mlm_positions: torch.Tensor, sentence_vectors: str | None = None,
                       clean: tuple[torch.Tensor, torch.Tensor] | None = None, padded: bool | None = None,
                       slots: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(MLM logits at the boolean (B, T) `mlm_positions`, (N, V) row-major, or with `slots` ((B, S) positions,
    `trainer.data.masking.in_slots`) at those, (B * S, V), spare slots included; NSP logits (B, 2); mean-pooled
    last-layer vectors (B, H) of `vector_inputs(sentence_vectors, ...)`, or None). With `slots` no shape depends
    on what the device computes: the step can be captured as a CUDA graph.

    Equal to `model(...)`'s logits, for less work: unless the pair's own sentence vectors are needed the heads
    read the last layer at the masked positions and [CLS] only, so that layer computes queries, attention, output
    projection and feed-forward for those ~16% of tokens (keys and values still for all). For `mini`
    this skips a fifth of the encoder's FLOPs. Sentence vectors of the pair need every token of the last layer.

    `padded`: whether `attention_mask` pads any row, if the caller knows (see `key_padding_mask`).
    """
    if not (model.has_mlm_head and model.has_nsp_head):
        raise RuntimeError("pre-training needs both the masked-LM and the next-sentence head")
    if sentence_vectors not in (None, *VECTOR_SOURCES):
        raise ValueError(f"sentence_vectors must be one of {VECTOR_SOURCES} or None, not {sentence_vectors!r}")
    if sentence_vectors is not None:
        ids, types, attention, pooled = vector_inputs(sentence_vectors, input_ids, token_type_ids, attention_mask,
                                                      mlm_positions, clean)
    embedded = model.bert.embeddings(input_ids, token_type_ids)
    key_mask = key_padding_mask(attention_mask, padded)
    if sentence_vectors in ("all", "unmasked"):
        hidden = model.bert.encoder(embedded, key_mask)  # (B, T, H)
        at_masked = hidden[mlm_positions] if slots is None else rows_at(hidden, slots).flatten(0, 1)
        mlm = model.cls.predictions(at_masked)
        nsp = model.nsp_logits_from_cls(hidden[:, 0])
        return mlm, nsp, mean_pooled(hidden, pooled)
    if slots is not None:  # [CLS] and the slots ask the last layer's queries: (B, 1 + S, H)
        kept = model.bert.encoder(embedded, key_mask, keep_last=torch.cat((torch.zeros_like(slots[:, :1]), slots), 1))
        mlm = model.cls.predictions(kept[:, 1:].flatten(0, 1))
        nsp = model.nsp_logits_from_cls(kept[:, 0])
    else:
        is_cls = torch.zeros_like(mlm_positions)
        is_cls[:, 0] = True
        keep = mlm_positions | is_cls
        kept = model.bert.encoder(embedded, key_mask, keep_last=keep)  # (K, H)
        mlm = model.cls.predictions(kept[mlm_positions[keep]])
        nsp = model.nsp_logits_from_cls(kept[is_cls[keep]])
    if sentence_vectors is None:
        return mlm, nsp, None
    # The clean segments, cut from pairs of different lengths, are padded: said so rather than asked of the device
    hidden = model.bert.encoder(model.bert.embeddings(ids, types), key_padding_mask(attention, padded=True))
    return mlm, nsp, mean_pooled(hidden, pooled)


def trace_whole() -> None:
    """Capture the last layer's kept tokens (a nonzero) and their count (an item) into a compiled graph instead of
    splitting it there: a pre-training step was 12 graphs (11 breaks), 1 with this (tests/trainer/test_compile.py).
    Process-wide settings: the trainer's process compiles nothing else."""
    torch._dynamo.config.capture_scalar_outputs = True
    torch._dynamo.config.capture_dynamic_output_shape_ops = True


def replays_cuda_graphs(options: TrainOptions, placement: Placement) -> bool:
    """Whether the step runs as CUDA graphs: --compile and --cuda-graphs, one process on a CUDA device, one
    micro-batch a step. Not under DDP (its all-reduce hooks run between the pieces of the backward) nor with
    --grad-accum (each micro-batch's backward would replay into the memory the gradients accumulate from): both
    untried on a GPU here, so they compile for changing shapes as before."""
    return (options.compile and options.cuda_graphs and placement.device.type == "cuda" and placement.world == 1
            and options.grad_accum == 1)


def compile_forward(step: nn.Module, backend: str = "inductor", cuda_graphs: bool = False) -> nn.Module:
    """`step` under torch.compile, whole: for changing shapes (batch widths and masked counts change every step),
    or, with `cuda_graphs`, for the one shape of a step in fixed slots (`trainer.data.masking.in_slots`), replayed as
    CUDA graphs (inductor's "reduce-overhead"): one launch for the forward and one for the backward where there
    were ~1,350 kernels to launch one by one, as long on the host as the device took to run them."""
    if cuda_graphs:
        return torch.compile(step, dynamic=False, backend=backend,
                             mode="reduce-overhead" if backend == "inductor" else None)
    trace_whole()
    return torch.compile(step, dynamic=True, backend=backend)


def cuda_graph_skips() -> int:
    """Graphs of the compiled step that inductor runs without CUDA graphs (it says why only under
    TORCH_LOGS=cudagraphs): 0 when the whole step replays as CUDA graphs."""
    from torch._dynamo.utils import counters

    return counters["inductor"]["cudagraph_skips"]


class PreTrainingForward(nn.Module):
    """The forward pass to the losses: DDP and torch.compile wrap a module's `forward`, and a compiled loss fuses
    the logits' cast to float32 with the softmax instead of writing the (N, V) logits out twice.

    Returns (MLM loss summed over the masked positions, NSP loss summed over the pairs, correct MLM predictions,
    correct NSP predictions, the sentence vectors or None), all on the device. `mlm_labels` are the masked
    positions' ids, row-major, or with `slots` the (B * S) slot labels, NO_LABEL where a slot is spare."""

    def __init__(self, model: BertForPreTraining, sentence_vectors: str | None = None):
        super().__init__()
        self.model = model
        self.sentence_vectors = sentence_vectors

    def forward(self, input_ids, token_type_ids, attention_mask, mlm_positions, mlm_labels, nsp_labels, clean=None,
                padded=None, slots=None):
        mlm, nsp, vectors = pretraining_logits(self.model, input_ids, token_type_ids, attention_mask, mlm_positions,
                                               self.sentence_vectors, clean, padded, slots)
        mlm, nsp = mlm.float(), nsp.float()  # losses in float32
        # Spare slots' NO_LABEL is the ignore_index: no loss, no gradient, and never equal to an argmax.
        return (F.cross_entropy(mlm, mlm_labels, reduction="sum", ignore_index=NO_LABEL),
                F.cross_entropy(nsp, nsp_labels, reduction="sum"),
                (mlm.argmax(-1) == mlm_labels).sum(), (nsp.argmax(-1) == nsp_labels).sum(), vectors)


__all__ = ["PreTrainingForward", "compile_forward", "cuda_graph_skips", "first_segments", "mean_pooled",
           "pretraining_logits", "replays_cuda_graphs", "trace_whole", "vector_inputs"]

"""The start-up check of CUDA graphs: every captured graph replayed once against the eager engine, before the
server says ready.

Each graph (each token bucket, and with a split each depth) gets a batch that fills it: as many tokens as the
bucket holds, in as many sequences as its slots take (three tokens or more each), of mixed lengths. The batch
goes through the engine twice, eagerly and through that graph, and the items the graph feeds are compared as a client
would get them: /encode's token vectors and its vectors pooled every way (which the graph computes itself), and on the
graph that feeds the heads, fill-mask's scores, NSP's and the classifier's logits where the checkpoint has those heads
(the graph computes those logits too). A graph whose replay raises, or whose answers drift, is dropped alone; its
batches run op by op (`EncoderGraphs.eager` says why).
"""

from __future__ import annotations

import dataclasses
from itertools import cycle

import numpy as np

from service.engine.graphs import EncoderGraphs, Layout, stage
from service.engine.pooling import POOLED
from service.tasks import ClassifyItem, EncodeItem, FillMaskItem, Item, NspItem

STATE_COSINE = 0.999  # per token or pooled vector, graphed against eager (products of different shapes, bfloat16)
NORM_RATIO = 0.01  # how far a pooled vector's length may stray from eager's (relative): normalised or not
ENCODINGS = (("none", False), *POOLED)  # what /encode's items ask for, in turn
HEAD_COSINE = 0.99  # fill-mask's centred log-scores, NSP's and the classifier's centred logits, over the batch
SCORED_TOKENS = 32  # fill-mask items score these many fixed vocabulary ids (the same in both runs)


def check_lengths(tokens: int, slots: int, longest: int) -> list[int]:
    """Sequence lengths that fill a graph of `tokens` rows and `slots` sequences (up to `longest` each): every
    slot used if the bucket holds three tokens a slot (a [MASK] between two), long and short inputs side by side."""
    count = max(1, min(slots, tokens // 3))
    tokens = min(tokens, count * longest)
    lengths = [tokens // count + (1 if n < tokens % count else 0) for n in range(count)]
    for n in range(0, count - 1, 2):  # pairs made uneven: one longer, one shorter, the sum unchanged
        moved = min(lengths[n + 1] - 3, longest - lengths[n], lengths[n + 1] // 2)
        if moved > 0:
            lengths[n] += moved
            lengths[n + 1] -= moved
    return lengths


def check_items(engine, lengths: list[int], whole_stack: bool, seed: int) -> list[Item]:
    """Inputs of `lengths` for the heads the graph feeds: /encode's token vectors only for the embedding-layer graph
    of a split; else those and every head the checkpoint has, in turn."""
    generator = np.random.default_rng(seed)
    vocab = engine.model.config.vocab_size
    scored = np.linspace(5, vocab - 1, SCORED_TOKENS, dtype=np.int64).tolist()
    kinds = ["encode"]
    if whole_stack:
        kinds += ["fill_mask"] * engine.has_mlm_head + ["nsp"] * engine.has_nsp_head
        kinds += ["classify"] * bool(engine.num_labels)
    items: list[Item] = []
    encodings = cycle(ENCODINGS)
    for n, length in enumerate(lengths):
        ids = generator.integers(5, vocab, length).tolist()
        kind = kinds[n % len(kinds)]
        if kind == "fill_mask" and length >= 3:
            items.append(FillMaskItem(ids, [0] * length, mask_positions=[1, length - 2], top_k=SCORED_TOKENS,
                                      target_ids=scored))
        elif kind in ("nsp", "classify"):
            types = [0] * (length // 2) + [1] * (length - length // 2)
            items.append((NspItem if kind == "nsp" else ClassifyItem)(ids, types))
        else:
            pooling, normalize = next(encodings)
            items.append(EncodeItem(ids, [0] * length, pooling=pooling, normalize=normalize))
    return items


def check_graph(engine, graphs: EncoderGraphs, key: tuple[int, bool], seed: int = 0) -> tuple[str | None, float]:
    """(None, the worst agreement) if graph `key` answers as the eager engine on a batch that fills it; else (why
    not, the worst agreement or NaN)."""
    tokens, whole_stack = key
    items = check_items(engine, check_lengths(tokens, graphs.slots, graphs.longest), whole_stack, seed)
    engine.use_graphs(None)
    eager_batch = engine.collate(items)
    eager = engine.run(eager_batch)
    layout = Layout(tokens, graphs.slots)
    staged = stage(eager_batch.input_ids.numpy(), eager_batch.token_type_ids.numpy(), eager_batch.packing, layout,
                   pin=engine.device.type == "cuda")
    engine.use_graphs(graphs)
    try:
        graphed = engine.run(dataclasses.replace(eager_batch, staged=staged, layout=layout))
    except Exception as exc:  # noqa: BLE001 - that graph is dropped, the others are checked
        return f"replay failed: {type(exc).__name__}: {exc}", float("nan")
    return disagreement(eager, graphed)


def disagreement(eager: list, graphed: list) -> tuple[str | None, float]:
    """(None, the worst agreement found) if two runs of one batch agree item by item, else (how they differ, it)."""
    if len(eager) != len(graphed):
        return f"{len(graphed)} results for {len(eager)} inputs", float("nan")
    cosines: dict[str, list] = {"token vectors": [], "pooled vectors": []}
    norms, heads = [], {"fill-mask": ([], []), "nsp": ([], []), "classify": ([], [])}
    for a, b in zip(eager, graphed):
        if type(a) is not type(b):
            return f"a {type(b).__name__} where eager gave a {type(a).__name__}", float("nan")
        if hasattr(a, "vectors"):
            if a.vectors.shape != b.vectors.shape:
                return f"token vectors of shape {b.vectors.shape} for {a.vectors.shape}", float("nan")
            cosines["token vectors"].append(_row_cosines(a.vectors, b.vectors))
        elif hasattr(a, "vector"):
            cosines["pooled vectors"].append(_row_cosines(a.vector[None], b.vector[None]))
            norms.append(float(np.linalg.norm(b.vector.astype(np.float64)) / np.linalg.norm(a.vector)) - 1)
        elif hasattr(a, "masks"):
            for mask_a, mask_b in zip(a.masks, b.masks, strict=True):
                by_id = dict(zip(mask_b.token_ids.tolist(), mask_b.scores.tolist()))
                if sorted(by_id) != sorted(mask_a.token_ids.tolist()):
                    return "fill-mask scored other tokens", float("nan")
                heads["fill-mask"][0].append(_centred(np.log(np.maximum(mask_a.scores, 1e-30))))
                heads["fill-mask"][1].append(_centred(np.log(np.maximum([by_id[t] for t in mask_a.token_ids.tolist()],
                                                                        1e-30))))
        else:
            kind = "nsp" if type(a).__name__ == "NspLogits" else "classify"
            heads[kind][0].append(_centred(a.logits))
            heads[kind][1].append(_centred(b.logits))
    worst = 1.0
    for kind, found in cosines.items():
        if found:
            cosine = float(np.concatenate(found).min())
            if not cosine >= STATE_COSINE:  # NaN fails too
                return f"{kind} drift (cosine {cosine:.6f} < {STATE_COSINE})", cosine
            worst = min(worst, cosine)
    stray = float(np.max(np.abs(norms))) if norms else 0.0
    if not stray <= NORM_RATIO:  # NaN fails too
        return f"pooled vectors' lengths drift (by {stray:.2%})", worst
    for kind, (a, b) in heads.items():
        if a:
            cosine = _cosine(np.concatenate(a), np.concatenate(b))
            if not cosine >= HEAD_COSINE:
                return f"{kind} drifts (cosine {cosine:.6f} < {HEAD_COSINE})", cosine
            worst = min(worst, cosine)
    return None, worst


def _centred(values) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    return values - values.mean()


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    norms = np.linalg.norm(a) * np.linalg.norm(b)
    return float(a @ b / norms) if norms > 0 else (1.0 if np.array_equal(a, b) else 0.0)


def _row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))

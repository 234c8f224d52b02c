"""`--dtype auto` on a CPU: bfloat16 where it is both faster and faithful to float32 on this host, else float32.

A CPU with native bfloat16 (AVX512-BF16 or AMX) computes a BERT about twice as fast in it as in float32; one
without emulates it, slower than float32 (docs/precision.md). Speed alone does not decide: a checkpoint whose
answers move in bfloat16 (a head near its decision boundaries, weights with a wide range) should stay exact. So
at start-up the model answers the calibration sentences (service/engine/data/calibration.txt) in both types,
through the same engine the service runs, and bfloat16 is taken only if
- every sentence's pooled vector stays within cosine AUTO_MIN_COSINE of float32's, and
- each head's best answer agrees with float32's on at least AUTO_MIN_AGREEMENT of the cases: fill-mask's top
  token at each sentence's middle word piece, next-sentence and the classifier's label on consecutive sentence
  pairs, the token classifier's label at every token, the answer span's start and end.
About a hundred short sequences in each type: a fraction of a second for a small model, a few for BERT-base.
What was measured, and why the choice fell as it did, goes to the log and to /info (`dtype_reason`). An
explicit `--dtype` is never second-guessed. int8 is faster still, but changes answers more: it stays a choice the
user makes (docs/precision.md).
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass

import numpy as np
import torch

from model.checkpoint import Checkpoint
from model.device import cpu_has_native_bf16
from model.fuse import fuse_attention_projections
from service.engine.engine import Engine
from service.engine.precision import CALIBRATION_TEXT, Precision, on_tiles
from service.tasks import ClassifyItem, EncodeItem, FillMaskItem, NspItem, QaItem, TokenClassifyItem

log = logging.getLogger("service")
AUTO_MIN_COSINE = 0.999
AUTO_MIN_AGREEMENT = 0.95
PROBE_SENTENCES = 48  # of the calibration text: a head may flip two of them and still pass AUTO_MIN_AGREEMENT
PROBE_BATCH = 16  # items per probe batch: start-up memory stays a small batch's


@dataclass(frozen=True)
class Fidelity:
    """How bfloat16's answers compare with float32's on the calibration sentences."""

    sentences: int
    min_cosine: float  # pooled vectors, the worst sentence
    agreement: dict[str, float]  # per head: the share of best answers bfloat16 keeps

    @property
    def faithful(self) -> bool:
        return self.min_cosine >= AUTO_MIN_COSINE and all(v >= AUTO_MIN_AGREEMENT for v in self.agreement.values())

    def describe(self) -> str:
        heads = "".join(f", {name} {share:.1%}" for name, share in self.agreement.items())
        return f"against float32 on {self.sentences} sentences: pooled vectors cosine >= {self.min_cosine:.5f}{heads}"


def choose_auto_on_cpu(checkpoint: Checkpoint) -> Precision:
    """The precision `--dtype auto` serves `checkpoint` in on this CPU (see the module's doc)."""
    if not cpu_has_native_bf16():
        return Precision("float32", torch.float32, "auto: float32 (this CPU has no native bfloat16)")
    fidelity = bfloat16_fidelity(checkpoint)
    if fidelity.faithful:
        reason = f"auto: bfloat16 (native on this CPU; {fidelity.describe()})"
        log.info("--dtype %s", reason)
        return Precision("bfloat16", torch.bfloat16, reason)
    reason = (f"auto: float32 (bfloat16 is native on this CPU, but moved this model's answers: {fidelity.describe()};"
              f" bfloat16 is taken at cosine >= {AUTO_MIN_COSINE} and agreement >= {AUTO_MIN_AGREEMENT:.0%})")
    log.warning("--dtype %s", reason)
    return Precision("float32", torch.float32, reason)


def bfloat16_fidelity(checkpoint: Checkpoint) -> Fidelity:
    """The calibration sentences through the checkpoint's model in float32 and in a bfloat16 copy. The float32
    engine is the checkpoint's own model with its attention projections fused (as every float engine serves it)."""
    tokenizer = checkpoint.tokenizer
    lines = CALIBRATION_TEXT.read_text(encoding="utf-8").splitlines()
    sentences = [line for line in lines if line.strip()][:PROBE_SENTENCES]
    singles = [(e.ids, e.type_ids) for e in tokenizer.encode_batch(sentences, truncate=True)]
    pairs = [(e.ids, e.type_ids) for e in tokenizer.encode_batch(list(zip(sentences, sentences[1:])), truncate=True)]
    model = fuse_attention_projections(checkpoint.model.float().eval())
    cpu = torch.device("cpu")
    # the bfloat16 copy as it would be served: its Linear layers on AMX's tiles where the CPU has them
    reference, candidate = Engine(model, cpu, torch.float32), Engine(copy.deepcopy(model), cpu, torch.bfloat16)
    on_tiles(candidate.model)
    probes = _probes(reference, singles, pairs, tokenizer.mask_id)
    exact, rounded = (_answers(engine, probes) for engine in (reference, candidate))
    cosines = [float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-12))
               for a, b in zip(exact["pooled"], rounded["pooled"])]
    agreement = {name: float(np.mean(np.asarray(exact[name]) == np.asarray(rounded[name])))
                 for name in exact if name != "pooled"}
    return Fidelity(len(singles), min(cosines), agreement)


def _probes(engine: Engine, singles, pairs, mask_id: int) -> dict[str, list]:
    """The items each of the model's heads is asked, by head."""
    probes: dict[str, list] = {"pooled": [EncodeItem(ids, types, pooling="mean") for ids, types in singles]}
    if engine.has_mlm_head:
        middles = [(ids, types, len(ids) // 2) for ids, types in singles]
        probes["fill-mask top-1"] = [FillMaskItem(ids[:at] + [mask_id] + ids[at + 1:], types, mask_positions=[at],
                                                  top_k=1) for ids, types, at in middles]
    if engine.has_nsp_head:
        probes["next-sentence"] = [NspItem(ids, types) for ids, types in pairs]
    if engine.num_labels:
        probes["classifier"] = [ClassifyItem(ids, types) for ids, types in pairs]
    if engine.num_token_labels:
        probes["token labels"] = [TokenClassifyItem(ids, types) for ids, types in singles]
    if engine.has_qa_head:
        probes["answer span"] = [QaItem(ids, types) for ids, types in pairs]
    return probes


def _answers(engine: Engine, probes: dict[str, list]) -> dict[str, list]:
    """Each probe's answer: pooled vectors as they are, every head's best answer(s) as integers."""
    found: dict[str, list] = {}
    for name, items in probes.items():
        results = [result for start in range(0, len(items), PROBE_BATCH)
                   for result in engine.run(engine.collate(items[start:start + PROBE_BATCH]))]
        if name == "pooled":
            found[name] = [r.vector.astype(np.float64) for r in results]
        elif name == "fill-mask top-1":
            found[name] = [int(r.masks[0].token_ids[0]) for r in results]
        elif name == "token labels":
            found[name] = [int(label) for r in results for label in r.logits.argmax(-1)]
        elif name == "answer span":
            found[name] = [int(i) for r in results for i in (r.start.argmax(), r.end.argmax())]
        else:
            found[name] = [int(r.logits.argmax()) for r in results]
    return found

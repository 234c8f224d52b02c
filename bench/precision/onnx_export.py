"""ONNX copies of a checkpoint for the ONNX Runtime rows: the in-process figure in bench.precision and
Infinity's optimum engine in bench.serving. Exported from `transformers` (what those users export),
then optionally quantized with ONNX Runtime's dynamic int8 (`quantize_dynamic`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch


class _LastHiddenState(torch.nn.Module):
    """BertModel called with keywords (its positional order changes between transformers versions)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def export_onnx(checkpoint_dir: Path, work: Path) -> Path:
    """`work/model.onnx`: BertModel's last hidden state from input_ids and attention_mask (dynamic axes)."""
    import transformers

    path = work / "model.onnx"
    if path.is_file():
        return path
    work.mkdir(parents=True, exist_ok=True)
    # float32 whatever the checkpoint stores (the bundled one is float16): quantize_dynamic wants float32 weights
    model = _LastHiddenState(transformers.BertModel.from_pretrained(checkpoint_dir, add_pooling_layer=False).float().eval())
    example = (torch.tensor([[101, 2023, 102]]), torch.ones(1, 3, dtype=torch.long))
    axes = {0: "batch", 1: "sequence"}
    torch.onnx.export(model, example, str(path), input_names=["input_ids", "attention_mask"],
                      output_names=["last_hidden_state"], dynamo=False, opset_version=17,
                      dynamic_axes={"input_ids": axes, "attention_mask": axes, "last_hidden_state": axes})
    return path


def quantize_onnx(model_path: Path, per_channel: bool, out: Path | None = None) -> Path:
    """ONNX Runtime dynamic int8: int8 weights (per tensor or per output channel), activations
    quantized per tensor at run time."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out = out or model_path.with_name(f"model-int8-{'per-channel' if per_channel else 'per-tensor'}.onnx")
    if not out.is_file():
        quantize_dynamic(str(model_path), str(out), weight_type=QuantType.QInt8, per_channel=per_channel)
    return out


def infinity_onnx_dir(checkpoint_dir: Path, work: Path, int8: bool) -> Path:
    """A model directory for Infinity's optimum engine: the checkpoint's files (linked) plus `model.onnx`,
    and with int8 also `model_quantized.onnx`, the file Infinity prefers on CPU."""
    target = work / ("onnx-int8" if int8 else "onnx-float32")
    if target.is_dir():
        return target
    exported = export_onnx(checkpoint_dir, work / "export")
    partial = work / (target.name + ".partial")  # renamed into place when whole
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for item in Path(checkpoint_dir).iterdir():
        (partial / item.name).symlink_to(item.resolve())
    (partial / "model.onnx").symlink_to(exported.resolve())
    if int8:
        quantize_onnx(exported, per_channel=False, out=partial / "model_quantized.onnx")
    partial.rename(target)
    return target

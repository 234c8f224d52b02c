"""A ColBERT's projection: the linear layers that turn each token's last hidden state into the small vector it
scores with (model.late_interaction says where they are stored). Read from safetensors, or from a PyTorch file
through `torch.load(weights_only=True)`, which unpickles tensors and plain containers only (older PyLate and
sentence-transformers versions wrote a Dense module's weights as `pytorch_model.bin`)."""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from model.checkpoint_files import CheckpointError
from model.late_interaction import COLBERT_AI_PROJECTION, LateInteraction, Projection

PICKLED_WEIGHTS = "pytorch_model.bin"


class ColbertProjection(nn.Module):
    """(N, hidden) -> (N, dim): the layers in order, no activation between them (PyLate's Dense with Identity)."""

    def __init__(self, layers: list[nn.Linear]):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    @property
    def in_features(self) -> int:
        return self.layers[0].in_features

    @property
    def out_features(self) -> int:
        return self.layers[-1].out_features

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            hidden = layer(hidden)
        return hidden


def load_projection(directory: Path, recipe: LateInteraction, hidden_size: int,
                    encoder_tensors: dict[str, torch.Tensor]) -> ColbertProjection:
    """The projection of the checkpoint in `directory`, checked against its encoder's `hidden_size`. colbert-ai keeps
    its `linear.weight` among the encoder's tensors: it is taken out of `encoder_tensors` here."""
    if recipe.projections[0].in_features != hidden_size:
        where = recipe.projections[0].weights or COLBERT_AI_PROJECTION
        width = recipe.projections[0].in_features
        raise CheckpointError(f"{directory}: the ColBERT projection ({where}) reads {width}-wide vectors but the "
                              f"encoder's hidden_size is {hidden_size}")
    layers = []
    for spec in recipe.projections:
        tensors = _colbert_ai_tensors(encoder_tensors) if spec.weights == "" else \
            _dense_tensors(directory / spec.weights)
        layers.append(_linear(directory / spec.weights, spec, tensors))
    return ColbertProjection(layers).eval()


def _colbert_ai_tensors(encoder_tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {"linear.weight": encoder_tensors.pop(COLBERT_AI_PROJECTION)}


def _dense_tensors(directory: Path) -> dict[str, torch.Tensor]:
    safe, pickled = directory / "model.safetensors", directory / PICKLED_WEIGHTS
    try:
        if safe.is_file():
            return load_file(str(safe))
        if pickled.is_file():
            loaded = torch.load(pickled, map_location="cpu", weights_only=True)
            if not isinstance(loaded, dict) or not all(isinstance(t, torch.Tensor) for t in loaded.values()):
                raise CheckpointError(f"{pickled}: expected a dictionary of tensors")
            return loaded
    except (SafetensorError, OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{directory}: the projection's weights cannot be read ({first_line})") from None
    raise CheckpointError(f"{directory}: no model.safetensors or {PICKLED_WEIGHTS} (the projection's weights)")


def _linear(where: Path, spec: Projection, tensors: dict[str, torch.Tensor]) -> nn.Linear:
    weight, bias = tensors.get("linear.weight"), tensors.get("linear.bias")
    want = (spec.out_features, spec.in_features)
    if weight is None or tuple(weight.shape) != want:
        found = "none" if weight is None else list(weight.shape)
        raise CheckpointError(f"{where}: linear.weight should be {list(want)} as its config says, found {found}")
    if spec.bias != (bias is not None):
        found = "have" if bias is not None else "lack"
        raise CheckpointError(f"{where}: the config says bias {spec.bias}, the weights {found} one")
    for name, tensor in (("linear.weight", weight), ("linear.bias", bias)):
        if tensor is not None and (not tensor.is_floating_point() or not torch.isfinite(tensor).all()):
            raise CheckpointError(f"{where}: {name} must hold finite floating-point values")
    layer = nn.Linear(spec.in_features, spec.out_features, bias=spec.bias)
    with torch.no_grad():
        layer.weight.copy_(weight.float())
        if bias is not None:
            layer.bias.copy_(bias.float())
    return layer

"""A bfloat16 batch on a CPU is computed on a rounded-up row count (model.row_buckets): few row counts, at most 1/16
extra, and the same bits for every real token as without the spare rows, on every CPU attention path, in every
route's head; float32 and the GPU do not round."""

from __future__ import annotations

import pytest
import torch

from model.packing import Packing
from model.row_buckets import rounds_rows, rows_to_compute
from tests.conftest import random_model
from tests.model.cpu_attention_paths import CPU_ATTENTION_PATHS, use_cpu_attention_path

LENGTHS = [9, 2, 30, 14, 16, 2]  # 73 tokens: computed on 80 rows


def test_rows_are_rounded_up_to_sixteen_sizes_a_doubling():
    sizes = {rows_to_compute(tokens) for tokens in range(1, 8193)}
    assert len(sizes) == 16 + 6 * 16  # multiples of 8 up to 128, then 16 sizes in each of the 6 doublings to 8,192
    for tokens in range(1, 8193):
        rows = rows_to_compute(tokens)
        assert tokens <= rows <= max(tokens + 7, tokens * 17 // 16 + 1) and rows_to_compute(rows) == rows
    assert [rows_to_compute(n) for n in (1, 8, 9, 128, 129, 1000, 1025)] == [8, 8, 16, 128, 136, 1024, 1088]


def test_only_bfloat16_on_a_cpu_rounds():
    assert rounds_rows(torch.device("cpu"), torch.bfloat16)
    assert not rounds_rows(torch.device("cpu"), torch.float32)
    assert not rounds_rows(torch.device("cpu"), torch.float16)
    assert not rounds_rows(torch.device("cuda"), torch.bfloat16)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_bfloat16_product_gives_each_row_the_same_bits_at_any_row_count(threads):
    """What the rounding rests on: oneDNN's result for a row does not depend on how many rows are computed with it."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        for inputs, outputs in ((384, 1152), (384, 1536), (1536, 384)):
            layer = torch.nn.Linear(inputs, outputs).bfloat16()
            x = torch.randn(1200, inputs, dtype=torch.bfloat16)
            with torch.no_grad():
                for rows in (1, 13, 72, 300, 1100):
                    assert torch.equal(layer(x[:rows]), layer(x[:rows_to_compute(rows)])[:rows])
    finally:
        torch.set_num_threads(before)


def test_spare_rows_are_zeros_in_the_padded_layout_and_dropped_from_it():
    packing = Packing.from_lengths([3, 2], spare_rows=3)
    assert packing.tokens == 5 and packing.with_spare_rows(torch.arange(1, 6)).tolist() == [1, 2, 3, 4, 5, 0, 0, 0]
    states = torch.arange(1, 9, dtype=torch.float32)[:, None].repeat(1, 2)  # 5 tokens, 3 spare rows
    padded = packing.pad(states)
    assert padded.shape == (2, 3, 2) and padded[1, 2].tolist() == [0, 0]
    back = packing.unpad(padded)
    assert torch.equal(back[:5], states[:5]) and not back[5:].any()


@pytest.mark.parametrize("path", [*CPU_ATTENTION_PATHS, "keys restricted"])
def test_spare_rows_change_no_bit_of_any_token(monkeypatch, path):
    use_cpu_attention_path(monkeypatch, "as chosen" if path == "keys restricted" else path)
    keys = [6, 2, 30, 5, 16, 2] if path == "keys restricted" else None
    model = random_model(300, num_hidden_layers=3, embedding_layer=2).bfloat16()  # heads read a layer above
    ids = torch.randint(5, 300, (sum(LENGTHS),), generator=torch.Generator().manual_seed(1))
    types = torch.zeros_like(ids)
    spare = rows_to_compute(len(ids)) - len(ids)
    assert spare == 7
    with torch.no_grad():
        plain = model.encode_packed(ids, types, Packing.from_lengths(LENGTHS, keys))
        rounded = model.encode_packed(ids, types, Packing.from_lengths(LENGTHS, keys, spare_rows=spare))
        served_only = model.encode_packed(ids, types, Packing.from_lengths(LENGTHS, keys, spare_rows=spare), False)
    for ours, reference in ((rounded[0], plain[0]), (rounded[1], plain[1]), (served_only[0], plain[0])):
        assert ours.shape == reference.shape == (len(ids), 64) and torch.equal(ours, reference)
    assert not torch.equal(plain[0], plain[1])  # two different layers: the check above compares both

"""The C kernels (model/int8_vnni.c, model/attention_cpu.c): equal to torch's results (int8 products bit for bit,
attention within float rounding), used by the model where they serve, and torch's path where they cannot run
(no such CPU, no compiler, a failed build), with a reason to show."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from model import attention_kernel, int8_layer, int8_vnni, native
from model.attention import attend_on_cpu
from model.packing import Packing
from model.quantize import Int8Linear, quantize
from tests.conftest import random_model

VNNI = int8_vnni.kernel()
ATTENTION = attention_kernel.kernel()
needs_vnni = pytest.mark.skipif(VNNI is None, reason=f"no VNNI kernel here: {int8_vnni.why_not()}")
needs_attention = pytest.mark.skipif(ATTENTION is None,
                                     reason=f"no attention kernel here: {attention_kernel.why_not()}")
# Inputs of about 3: float32 rounding, summed in another order than torch's
CLOSE = dict(atol=1e-4, rtol=1e-4)


@needs_vnni
@pytest.mark.parametrize("k, n", [(384, 1152), (1536, 384), (64, 48), (8, 200), (96, 17)])
@pytest.mark.parametrize("m", [1, 5, 6, 7, 17, 34, 100])
def test_vnni_products_equal_int_mm_bit_for_bit(m, k, n):
    generator = torch.Generator().manual_seed(m * 7 + k + n)
    weight_t = torch.randint(-127, 128, (k, n), dtype=torch.int8, generator=generator)
    rows = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=generator)
    rows[0, :4] = torch.tensor([-128, 127, -128, 127], dtype=torch.int8)  # the extremes of both signs
    padded = torch.cat([rows, rows.new_zeros(max(0, 17 - m), k)])
    got = VNNI.matmul(rows, VNNI.pack(weight_t))
    assert got.shape == (m, n) and got.dtype == torch.int32
    assert torch.equal(got, torch._int_mm(padded, weight_t)[:m])


@needs_vnni
def test_vnni_refuses_what_it_cannot_compute():
    packed = VNNI.pack(torch.ones(8, 16, dtype=torch.int8))
    with pytest.raises(ValueError, match="contiguous int8 rows of 8"):
        VNNI.matmul(torch.ones(3, 12, dtype=torch.int8), packed)
    with pytest.raises(ValueError, match="contiguous int8 rows"):
        VNNI.matmul(torch.ones(8, 3, dtype=torch.int8).t(), packed)
    with pytest.raises(ValueError, match="multiple of 4"):
        VNNI.pack(torch.ones(6, 16, dtype=torch.int8))


@needs_vnni
def test_int8_model_gives_the_same_embeddings_with_and_without_the_vnni_kernel(tokenizer, monkeypatch):
    monkeypatch.setattr(int8_layer, "kernel", lambda: None)  # the layers' modules, each product through the kernel
    model = quantize(random_model(tokenizer.vocab_size), "per-token")
    layers = [module for module in model.modules() if isinstance(module, Int8Linear)]
    assert layers and all(layer.vnni is VNNI for layer in layers)
    lengths = [3, 20, 9]
    ids = torch.randint(5, tokenizer.vocab_size, (sum(lengths),), generator=torch.Generator().manual_seed(1))
    packing = Packing.from_lengths(lengths)
    with torch.inference_mode():
        with_kernel, _ = model.encode_packed(ids, torch.zeros_like(ids), packing, for_heads=False)
        for layer in layers:
            layer.vnni = None
        without, _ = model.encode_packed(ids, torch.zeros_like(ids), packing, for_heads=False)
    assert torch.equal(with_kernel, without)  # the integer products are equal, and all else is the same code


@contextmanager
def torch_threads(count: int):
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@needs_vnni
@pytest.mark.parametrize("threads", [2, 3, 8])
@pytest.mark.parametrize("m, k, n", [(1, 384, 1152), (34, 384, 384), (100, 64, 80), (13, 96, 17), (7, 1536, 384)])
def test_vnni_products_on_several_threads_equal_one_thread(threads, m, k, n):
    """Each thread takes a run of column blocks, and each block's row tiles too where threads outnumber blocks
    (8 threads over 80 columns: 2 blocks of 17 row tiles)."""
    generator = torch.Generator().manual_seed(m + k + n)
    packed = VNNI.pack(torch.randint(-127, 128, (k, n), dtype=torch.int8, generator=generator))
    rows = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=generator)
    with torch_threads(1):
        alone = VNNI.matmul(rows, packed)
    with torch_threads(threads):
        assert torch.equal(VNNI.matmul(rows, packed), alone)


@pytest.mark.skipif(VNNI is None and ATTENTION is None, reason="no C kernel here")
def test_the_kernels_share_torchs_openmp_runtime():
    """Two OpenMP thread pools on the same cores would spin against each other: the kernels' libgomp must be the
    one torch loaded."""
    assert len(native.openmp_runtimes()) == 1, native.openmp_runtimes()


def packed_qkv(lengths: list[int], heads: int, head_dim: int, seed: int = 0) -> tuple[torch.Tensor, Packing]:
    qkv = torch.randn(sum(lengths), 3 * heads * head_dim, generator=torch.Generator().manual_seed(seed)) * 3
    return qkv, Packing.from_lengths(lengths)


def sdpa_each(qkv: torch.Tensor, packing: Packing, heads: int, head_dim: int) -> torch.Tensor:
    out = qkv.new_empty(qkv.shape[0], heads * head_dim)
    for start, length in packing.spans:
        q, k, v = qkv[start:start + length].view(1, length, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
        out[start:start + length] = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(length, -1)
    return out


@needs_attention
@pytest.mark.parametrize("heads, head_dim, lengths", [
    (12, 32, [34]), (4, 16, [1]), (4, 16, [1, 2, 15, 16, 17, 33]), (2, 64, [96, 5]), (12, 32, [40, 40, 40]),
])
def test_attention_kernel_matches_sdpa_sequence_by_sequence(heads, head_dim, lengths):
    qkv, packing = packed_qkv(lengths, heads, head_dim)
    out = torch.full((qkv.shape[0], heads * head_dim), float("nan"))
    ATTENTION.attend(qkv, packing.starts, packing.lengths, packing.max_length, heads, head_dim, out)
    torch.testing.assert_close(out, sdpa_each(qkv, packing, heads, head_dim), **CLOSE)


@needs_attention
@pytest.mark.parametrize("threads", [2, 5])
def test_attention_kernel_on_several_threads_equals_one_thread(threads):
    """The threads split (sequence, head) pairs, each with scratch of its own: 3 sequences x 4 heads."""
    heads, head_dim = 4, 16
    qkv, packing = packed_qkv([30, 1, 17], heads, head_dim, seed=5)
    alone, together = (torch.full((qkv.shape[0], heads * head_dim), float("nan")) for _ in range(2))
    with torch_threads(1):
        ATTENTION.attend(qkv, packing.starts, packing.lengths, packing.max_length, heads, head_dim, alone)
    with torch_threads(threads):
        ATTENTION.attend(qkv, packing.starts, packing.lengths, packing.max_length, heads, head_dim, together)
    assert torch.equal(together, alone)


@needs_attention
def test_attend_on_cpu_mixes_the_kernel_for_short_sequences_with_torch_for_long_ones():
    heads, head_dim = 4, 16
    lengths = [attention_kernel.MAX_LENGTH + 30, 7, 3, attention_kernel.MAX_LENGTH + 1, 50]
    qkv, packing = packed_qkv(lengths, heads, head_dim, seed=3)
    got = attend_on_cpu(qkv, packing, heads, head_dim)
    assert got is not None  # mixed lengths: one call per sequence beats the padded call
    torch.testing.assert_close(got, sdpa_each(qkv, packing, heads, head_dim), **CLOSE)
    # bfloat16 in, bfloat16 out (computed in float32)
    half = attend_on_cpu(qkv.bfloat16(), packing, heads, head_dim)
    assert half.dtype == torch.bfloat16


@needs_attention
def test_attention_kernel_is_not_used_when_gradients_are_asked_for(monkeypatch):
    heads, head_dim = 4, 16
    qkv, packing = packed_qkv([5, 90, 9], heads, head_dim)

    def no_call(*args):
        raise AssertionError("the kernel has no backward")

    monkeypatch.setattr(ATTENTION, "attend", no_call)
    got = attend_on_cpu(qkv.requires_grad_(True), packing, heads, head_dim)
    assert got is not None and got.grad_fn is not None  # torch's attention, one call per sequence


@pytest.mark.skipif(VNNI is None, reason="no VNNI kernel here")
def test_native_load_refuses_a_second_openmp_runtime(monkeypatch):
    """Where a kernel's libgomp.so.1 is not torch's (a torch built with another OpenMP), torch's kernels serve."""
    monkeypatch.setattr(native, "openmp_runtimes",
                        lambda: ["/torch/lib/libgomp-a34b3233.so.1", "/usr/lib/libgomp.so.1"])
    with pytest.raises(native.NativeUnavailable, match="an OpenMP runtime other than torch's: /torch/lib/libgomp-a34b"):
        native.load(int8_vnni.SOURCE_NAME)


def test_native_load_explains_a_cpu_without_the_features(monkeypatch):
    monkeypatch.setattr(native, "_cpu_flags", lambda: {"sse2"})
    with pytest.raises(native.NativeUnavailable, match="this CPU lacks avx512f"):
        native.load(int8_vnni.SOURCE_NAME)


def test_native_build_without_a_compiler_or_with_a_broken_source_says_why(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "kernel_directories", lambda: [tmp_path / "kernels"])
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    with pytest.raises(native.NativeUnavailable, match="no C compiler"):
        native.build(int8_vnni.SOURCE_NAME, native.KERNELS[int8_vnni.SOURCE_NAME][0])
    monkeypatch.delenv("CC")
    monkeypatch.setattr(native, "HERE", tmp_path)
    (tmp_path / "broken.c").write_text("int f( {\n")
    with pytest.raises(native.NativeUnavailable, match="building broken.c failed"):
        native.build("broken.c", ("-O1",))
    assert not any((tmp_path / "kernels").iterdir())  # no half-built library left behind


def test_native_build_reuses_a_built_library_and_rebuilds_a_changed_source(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "kernel_directories", lambda: [tmp_path / "kernels"])
    monkeypatch.setattr(native, "HERE", tmp_path)
    source = tmp_path / "twice.c"
    source.write_text("int twice(int x) { return 2 * x; }\n")
    first = native.build("twice.c", ("-O1",))
    built_at = first.stat().st_mtime_ns
    assert native.build("twice.c", ("-O1",)) == first and first.stat().st_mtime_ns == built_at
    source.write_text("int twice(int x) { return x + x; }\n")
    second = native.build("twice.c", ("-O1",))
    assert second != first and second.is_file()


def test_without_the_kernels_the_int8_model_still_runs_through_torch(monkeypatch, tokenizer):
    """What a machine without the CPU features or a compiler gets: torch's products and attention, same results."""
    monkeypatch.setattr(int8_vnni, "kernel", lambda: None)
    monkeypatch.setattr(attention_kernel, "kernel", lambda: None)
    model = quantize(random_model(tokenizer.vocab_size), "per-token")
    assert all(layer.vnni is None for layer in model.modules() if isinstance(layer, Int8Linear))
    assert not any(isinstance(layer, int8_layer.Int8FusedLayer) for layer in model.bert.encoder.layer)
    ids = torch.randint(5, tokenizer.vocab_size, (12,), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        out, _ = model.encode_packed(ids, torch.zeros_like(ids), Packing.from_lengths([12]), for_heads=False)
    assert out.shape == (12, model.config.hidden_size) and torch.isfinite(out).all()


def test_kernel_directories_honour_bert_kernel_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("BERT_KERNEL_DIR", str(tmp_path))
    assert native.kernel_directories()[0] == Path(tmp_path)
    monkeypatch.delenv("BERT_KERNEL_DIR")
    assert native.kernel_directories()[0] != Path(tmp_path) and str(os.getuid()) in str(native.kernel_directories()[-1])


def test_native_py_alone_builds_every_kernel(tmp_path):
    """How the Docker image builds them: model/native.py and the C files, no torch, no package."""
    import shutil
    import subprocess
    import sys

    for name in ("native.py", *native.KERNELS):
        shutil.copy(Path(native.__file__).with_name(name), tmp_path / name)
    env = {"PATH": os.environ["PATH"], "BERT_KERNEL_DIR": str(tmp_path / "kernels"), "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-S", str(tmp_path / "native.py")], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    built = sorted((tmp_path / "kernels").glob("*.so"))
    assert sorted(path.name.split("-")[0] for path in built) == sorted(Path(name).stem for name in native.KERNELS)
    assert all(path.stat().st_mode & 0o555 == 0o555 for path in built)  # loadable by the image's unprivileged user


def test_first_use_builds_once_and_keeps_the_reason_a_kernel_cannot_run(monkeypatch):
    loads = []
    monkeypatch.setattr(native, "load", lambda name: loads.append(name) or object())

    def differs(candidate):
        raise native.NativeUnavailable("its products differ from torch's")

    failing = native.FirstUse("some.c", lambda library: library, differs, "torch's kernel")
    assert failing.why_not() is None  # not asked yet
    assert failing() is None and failing() is None and loads == ["some.c"]  # built and checked once
    assert failing.why_not() == "its products differ from torch's"
    working = native.FirstUse("other.c", lambda library: ("wrapped", library), lambda candidate: None, "torch's")
    assert working()[0] == "wrapped" and working() is working() and working.why_not() is None


def test_a_kernel_is_missing_only_where_it_cannot_run():
    """The kernels' tests skip where a kernel is missing; a kernel that fails its own check at first use must fail
    here instead of passing as "cannot run on this machine"."""
    for module in (int8_vnni, attention_kernel, int8_layer):
        module.kernel()
        reason = module.why_not()
        assert reason is None or reason.startswith(("this CPU lacks", "no C compiler", "the C kernels are for",
                                                    "cannot read the CPU's flags")), reason


def test_first_use_from_several_threads_builds_once_and_gives_all_the_kernel(monkeypatch):
    import threading
    import time

    loads, inner = [], []
    monkeypatch.setattr(native, "load", lambda name: loads.append(name) or "library")

    def slow_check(candidate):
        inner.append(first_use())  # what the check's own models get: not the kernel being checked
        time.sleep(0.2)

    first_use = native.FirstUse("some.c", lambda library: ("wrapped", library), slow_check, "torch's")
    got = []
    callers = [threading.Thread(target=lambda: got.append(first_use())) for _ in range(4)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert loads == ["some.c"] and inner == [None] and got == [("wrapped", "library")] * 4

"""Building the C kernels (kernels.build) and loading them once, checked (kernels.loading): where they cannot run,
a reason to show and torch's path; nothing half-built left behind; a check that leaves torch as it found it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from kernels import attention, bf16_layer, bf16_linear, build, cpu_features, int8_layer, int8_products, loading


@pytest.mark.skipif(int8_products.kernel() is None, reason="no products kernel here")
def test_load_refuses_a_second_openmp_runtime(monkeypatch):
    """Where a kernel's libgomp.so.1 is not torch's (a torch built with another OpenMP), torch's kernels serve."""
    monkeypatch.setattr(loading, "openmp_runtimes",
                        lambda: ["/torch/lib/libgomp-a34b3233.so.1", "/usr/lib/libgomp.so.1"])
    source = int8_products.SOURCE_NAME if int8_products.vnni_kernel() else \
        int8_products.AVX2_SOURCE_NAME  # one that this CPU can load
    with pytest.raises(loading.KernelUnavailable, match="OpenMP runtime other than torch's: /torch/lib/libgomp-a34b"):
        loading.load(source)


def test_load_explains_a_cpu_without_the_features(monkeypatch):
    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: frozenset({"sse2"}))
    with pytest.raises(loading.KernelUnavailable, match="this CPU lacks avx512f"):
        loading.load(int8_products.SOURCE_NAME)
    with pytest.raises(loading.KernelUnavailable, match="this CPU lacks avx2"):
        loading.load(int8_products.AVX2_SOURCE_NAME)


def test_build_without_a_compiler_or_with_a_broken_source_says_why(monkeypatch, tmp_path):
    monkeypatch.setattr(build, "kernel_directories", lambda: [tmp_path / "kernels"])
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    with pytest.raises(build.BuildFailed, match="no C compiler"):
        build.build(int8_products.SOURCE_NAME)
    monkeypatch.delenv("CC")
    monkeypatch.setattr(build, "SOURCES", tmp_path)
    (tmp_path / "broken.c").write_text("int f( {\n")
    with pytest.raises(build.BuildFailed, match="building broken.c failed"):
        build.build("broken.c", ("-O1",))
    assert not any((tmp_path / "kernels").iterdir())  # no half-built library left behind


def test_build_reuses_a_built_library_and_rebuilds_a_changed_source(monkeypatch, tmp_path):
    monkeypatch.setattr(build, "kernel_directories", lambda: [tmp_path / "kernels"])
    monkeypatch.setattr(build, "SOURCES", tmp_path)
    source = tmp_path / "twice.c"
    source.write_text("int twice(int x) { return 2 * x; }\n")
    first = build.build("twice.c", ("-O1",))
    built_at = first.stat().st_mtime_ns
    assert build.build("twice.c", ("-O1",)) == first and first.stat().st_mtime_ns == built_at
    source.write_text("int twice(int x) { return x + x; }\n")
    second = build.build("twice.c", ("-O1",))
    assert second != first and second.is_file()


def test_kernel_directories_honour_bert_kernel_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("BERT_KERNEL_DIR", str(tmp_path))
    assert build.kernel_directories()[0] == Path(tmp_path)
    monkeypatch.delenv("BERT_KERNEL_DIR")
    assert build.kernel_directories()[0] != Path(tmp_path) and str(os.getuid()) in str(build.kernel_directories()[-1])


def test_the_build_module_alone_builds_every_kernel(tmp_path):
    """How the Docker image builds them: the package's __init__, build.py and the C files, no torch, no site."""
    package = tmp_path / "kernels"
    (package / "c").mkdir(parents=True)
    for name in ("__init__.py", "build.py"):
        shutil.copy(Path(build.__file__).with_name(name), package / name)
    for source in build.SOURCES.glob("*.c"):  # the kernels and the files they include, as the image copies them
        shutil.copy(source, package / "c" / source.name)
    env = {"PATH": os.environ["PATH"], "BERT_KERNEL_DIR": str(tmp_path / "built"), "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-S", "-m", "kernels.build"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    built = sorted((tmp_path / "built").glob("*.so"))
    assert sorted(path.name.split("-")[0] for path in built) == sorted(Path(name).stem for name in build.KERNELS)
    assert all(path.stat().st_mode & 0o555 == 0o555 for path in built)  # loadable by the image's unprivileged user
    (package / "c" / "attention.c").write_text("int f( {\n")  # a failed build: one line naming it, no traceback
    failed = subprocess.run([sys.executable, "-S", "-m", "kernels.build"], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=300)
    assert failed.returncode != 0 and failed.stderr.startswith("kernels.build: building attention.c failed")
    assert "Traceback" not in failed.stderr


def test_first_use_builds_once_and_keeps_the_reason_a_kernel_cannot_run(monkeypatch):
    loads = []
    monkeypatch.setattr(loading, "load", lambda name: loads.append(name) or object())

    def differs(candidate):
        raise loading.KernelUnavailable("its products differ from torch's")

    failing = loading.FirstUse("some.c", lambda library: library, differs, "torch's kernel")
    assert failing.why_not() is None  # not asked yet
    assert failing() is None and failing() is None and loads == ["some.c"]  # built and checked once
    assert failing.why_not() == "its products differ from torch's"
    working = loading.FirstUse("other.c", lambda library: ("wrapped", library), lambda candidate: None, "torch's")
    assert working()[0] == "wrapped" and working() is working() and working.why_not() is None


def test_a_fault_in_a_check_leaves_the_torch_path_serving_and_says_so(monkeypatch, caplog):
    monkeypatch.setattr(loading, "load", lambda name: object())

    def faulty(candidate):
        return candidate.fits()  # a bug of ours, not something this CPU lacks

    broken = loading.FirstUse("some.c", lambda library: library, faulty, "torch's kernel")
    with caplog.at_level("WARNING", logger="kernels"):
        assert broken() is None and broken() is None
    assert broken.why_not().startswith("its first-use check failed: AttributeError")
    assert "torch's kernel" in caplog.text and "Traceback" in caplog.text


def test_a_kernel_is_missing_only_where_it_cannot_run():
    """The kernels' tests skip where a kernel is missing; a kernel that fails its own check at first use must fail
    here instead of passing as "cannot run on this machine"."""
    first_uses = [bf16_linear.kernel, bf16_layer.kernel]
    for chosen in (int8_products.kernel, attention.kernel, attention.bfloat16_kernel, int8_layer.kernel):
        first_uses += chosen.choices  # each instruction set's kernel, where the first that runs is used
    for choice in first_uses:
        choice()
        reason = choice.why_not()
        assert reason is None or reason.startswith(("this CPU lacks", "no C compiler", "the C kernels are for",
                                                    "cannot read the CPU's flags", "the int8 layer needs",
                                                    "Linux did not let this process use AMX")), reason


def test_first_use_from_several_threads_builds_once_and_gives_all_the_kernel(monkeypatch):
    loads, inner = [], []
    monkeypatch.setattr(loading, "load", lambda name: loads.append(name) or "library")

    def slow_check(candidate):
        inner.append(first_use())  # what the check's own models get: not the kernel being checked
        time.sleep(0.2)

    first_use = loading.FirstUse("some.c", lambda library: ("wrapped", library), slow_check, "torch's")
    got = []
    callers = [threading.Thread(target=lambda: got.append(first_use())) for _ in range(4)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert loads == ["some.c"] and inner == [None] and got == [("wrapped", "library")] * 4


@pytest.mark.parametrize("module", [int8_products, attention, int8_layer, bf16_linear, bf16_layer],
                         ids=lambda m: m.__name__)
def test_a_first_use_check_leaves_the_global_seed_and_the_thread_count_alone(module, monkeypatch):
    """Each check runs again here, as at a first use: torch's global generator and thread count come out as they
    went in (the int8 layer's check runs the layer on one thread and on three)."""
    candidate = module.kernel()
    if candidate is None:
        pytest.skip(f"no such kernel here: {module.why_not()}")
    threads = torch.get_num_threads()
    torch.manual_seed(1234)
    expected_draw = torch.rand(3)
    torch.manual_seed(1234)
    set_threads = []
    monkeypatch.setattr(torch, "set_num_threads", lambda count: set_threads.append(count))
    module._check(candidate)
    assert torch.equal(torch.rand(3), expected_draw) and set_threads == [] and torch.get_num_threads() == threads

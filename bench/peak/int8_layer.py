"""The one-call int8 layer (kernels/c/int8_layer.c with VNNI, int8_layer_amx.c with AMX, int8_layer_avx2.c with AVX2)
against the same layer run as its modules (each product, row step and attention its own call): all-MiniLM-L6-v2 quantized as the service does
(`--dtype int8`), its first layer, on packed batches from one short query to a bulk batch and one long passage.

    python -m bench.peak.int8_layer                          # 1 and 2 threads, the shapes below
    python -m bench.peak.int8_layer --threads 2 --batches 1x34 16x30

Where the CPU runs two one-call layers on the same weights (AMX's and VNNI's), each has its rows, the layer the
service runs first. Each figure: the fastest of 20 calls after warm-ups, the ways taking turns. The layer's output is
checked equal
to the modules' first where both run the same attention kernel: the modules hand sequences longer than the kernel's
longest (kernels.attention: 512 tokens with AVX-512, 256 with AVX2) to torch's attention, and such rows are marked.
"""

from __future__ import annotations

import argparse

import torch

from bench.precision.variants import quantized
from bench.serving.throughput import parse_load
from bench.serving.timing import best_ms
from devkit.paths import minilm_dir
from model.bert import BertLayer
from model.packing import Packing


def shape(text: str) -> tuple[int, int]:
    """'16x30' -> 16 sequences of 30 tokens."""
    try:
        count, length = parse_load(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a batch is SEQUENCESxTOKENS, such as 16x30, not {text!r}") from None
    if count < 1 or not 1 <= length <= 512:
        raise argparse.ArgumentTypeError(f"{text}: at least one sequence, of 1-512 tokens")
    return count, length


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=shape, nargs="+", default=[(1, 34), (16, 30), (64, 128), (1, 512)],
                        help="SEQUENCESxTOKENS each (default: 1x34 16x30 64x128 1x512)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    import kernels
    from kernels import attention, int8_layer
    from model.checkpoint import load_checkpoint
    from service.engine.precision import INT8_ALPHA, INT8_SCHEME

    kernels.install()
    if int8_layer.kernel() is None:
        raise SystemExit(f"no one-call int8 layer here: {int8_layer.why_not()}")
    checkpoint = load_checkpoint(minilm_dir())
    model = quantized(checkpoint.model.eval(), checkpoint.tokenizer, INT8_SCHEME, INT8_ALPHA)
    layer = model.bert.encoder.layer[0]
    if not isinstance(layer, int8_layer.Int8FusedLayer):
        raise SystemExit("the quantized model's layers are not one-call layers")
    kernel, longest = int8_layer.kernel(), attention.kernel().max_length
    # every one-call layer this CPU runs that reads the weights as laid out here, the service's first
    variants = [found for found in (choice() for choice in int8_layer.kernel.choices)
                if found is not None and found.layout == kernel.layout]
    print(f"\nall-MiniLM-L6-v2 int8, one layer: the {' and '.join(v.products for v in variants)} one-call layer "
          "against its modules\n\n| threads | batch | one call ms | modules ms | one call / modules | layer |\n"
          "| ---: | --- | ---: | ---: | ---: | --- |")
    generator = torch.Generator().manual_seed(0)
    for threads in args.threads:
        torch.set_num_threads(threads)
        for count, length in args.batches:
            packing = Packing.from_lengths([length] * count)
            x = torch.randn(count * length, layer.weights.hidden, generator=generator)
            calls = {variant.products: (lambda v=variant: v.run(layer.weights, x, packing)) for variant in variants}
            with torch.inference_mode():
                modules = lambda: BertLayer.forward(layer, x, packing)  # noqa: E731
                if length <= longest and not all(torch.equal(call(), modules()) for call in calls.values()):
                    raise SystemExit(f"a one-call layer differs from its modules at {count}x{length}")
                mine, theirs = dict.fromkeys(calls, float("inf")), float("inf")
                for _ in range(2):  # in turn, so that a slow spell of a shared machine falls on all
                    for name, call in calls.items():
                        mine[name] = min(mine[name], best_ms(call, 10, warm_ups=1))
                    theirs = min(theirs, best_ms(modules, 10, warm_ups=1))
            note = " (modules: torch's attention)" if length > longest else ""
            for name, ms in mine.items():
                print(f"| {threads} | {count} x {length}{note} | {ms:.3f} | {theirs:.3f} | {ms / theirs:.2f} | {name} |",
                      flush=True)


if __name__ == "__main__":
    main()

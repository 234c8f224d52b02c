"""The int8 products kernels (kernels/c/int8_products_amx.c with AMX, int8_products.c with VNNI, int8_products_avx2.c
with AVX2) against what runs
beside or without them: torch's float32 product of the same shape (what a float32 model computes instead) and
torch._int_mm (the int8 path where no kernel runs), at all-MiniLM-L6-v2's four layer shapes summed, for a query's
rows up to a large batch's.

    python -m bench.peak.int8_products                  # every kernel this CPU runs, 1 and 2 threads
    python -m bench.peak.int8_products --rows 34 2048 --threads 2
    python -m bench.peak.int8_products --skip-int-mm    # leave torch._int_mm out (minutes where no VNNI runs it)

Each row: the fastest of 5 calls after a warm-up of each of the four products, summed; the kernel's products are
checked equal to torch._int_mm's first.
"""

from __future__ import annotations

import argparse

import torch

from bench.serving.timing import best_ms
from kernels import int8_products

# all-MiniLM-L6-v2's products (inputs, outputs): query | key | value fused, attention's output, feed-forward in, out
SHAPES = ((384, 1152), (384, 384), (384, 1536), (1536, 384))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 34, 256, 2048])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--skip-int-mm", action="store_true", help="leave torch._int_mm's column out")
    args = parser.parse_args()
    runnable = {}
    for choice in int8_products.kernel.choices:  # every instruction set's kernel, the best first
        found = choice()
        if found is None:
            print(f"{choice.source_name}: not here ({choice.why_not()})")
        else:
            runnable[found.instruction_set] = found
    if not runnable:
        raise SystemExit(f"no int8 products kernel here: {int8_products.why_not()}")
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randint(-127, 128, shape, dtype=torch.int8, generator=generator) for shape in SHAPES]
    int_mm = "" if args.skip_int_mm else " torch._int_mm ms | kernel / _int_mm |"
    print(f"\nall-MiniLM-L6-v2's four products per layer\n\n| kernel | threads | rows | kernel ms | GOP/s | "
          f"float32 ms | kernel / float32 |{int_mm}\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
          f"{'' if args.skip_int_mm else ' ---: | ---: |'}")
    for name, kernel in runnable.items():
        blocked = [kernel.block(weight) for weight in weights]
        floats = [weight.float() for weight in weights]
        for threads in args.threads:
            torch.set_num_threads(threads)
            for rows in args.rows:
                inputs = [torch.randint(-128, 128, (rows, weight.shape[0]), dtype=torch.int8, generator=generator)
                          for weight in weights]
                padded = [torch.cat([x, x.new_zeros(max(0, 17 - rows), x.shape[1])]) for x in inputs]
                for x, weight, block, wide in zip(inputs, weights, blocked, padded):
                    if not torch.equal(kernel.matmul(x, block), torch._int_mm(wide, weight)[:rows]):
                        raise SystemExit(f"the {name} kernel's products differ from torch._int_mm's at "
                                         f"{tuple(x.shape)}")
                mine = sum(best_ms(lambda: kernel.matmul(x, b), 5, warm_ups=1) for x, b in zip(inputs, blocked))
                as_float = [x.float() for x in inputs]
                float_ms = sum(best_ms(lambda: x @ w, 5, warm_ups=1) for x, w in zip(as_float, floats))
                operations = sum(2 * rows * k * n for k, n in SHAPES)
                line = f"| {name} | {threads} | {rows} | {mine:.3f} | {operations / mine / 1e6:.0f} | " \
                       f"{float_ms:.3f} | {mine / float_ms:.2f} |"
                if not args.skip_int_mm:
                    theirs = sum(best_ms(lambda: torch._int_mm(x, w), 3, warm_ups=1)
                                 for x, w in zip(padded, weights))
                    line += f" {theirs:.3f} | {mine / theirs:.3f} |"
                print(line, flush=True)


if __name__ == "__main__":
    main()

"""bfloat16 Linear layers on AMX's tiles (kernels/c/bf16_products_amx.c, kernels.bf16_linear) against torch's own
bfloat16 Linear (oneDNN, itself on AMX), at all-MiniLM-L6-v2's four layer shapes summed, from a query's rows to a
bulk batch's: what decides `bf16_linear.MOST_ROWS`, the row count above which torch's products serve.

    python -m bench.peak.bf16_products                   # 1 and 2 threads, 21 to 4,096 rows
    python -m bench.peak.bf16_products --rows 21 1024 --threads 1
    python -m bench.peak.bf16_products --cold            # 24 different weights in turn, as six layers read them

Each row: the fastest of 5 passes over the four products (with --cold, over six layers' 24) after a warm-up; the
tiles' outputs are checked against float32 products of the same numbers first.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from bench.serving.timing import best_ms
from kernels import bf16_linear

# all-MiniLM-L6-v2's products (inputs, outputs): query | key | value fused, attention's output, feed-forward in, out
SHAPES = ((384, 1152), (384, 384), (384, 1536), (1536, 384))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[21, 256, 1024, 4096])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--cold", action="store_true",
                        help="six layers' weights (24 products) in turn, so that they come from memory as in a model")
    args = parser.parse_args()
    tiles = bf16_linear.kernel()
    if tiles is None:
        raise SystemExit(f"no bfloat16 tile products here: {bf16_linear.why_not()}")
    torch.manual_seed(0)
    layers = [nn.Linear(k, n).bfloat16() for _ in range(6 if args.cold else 1) for k, n in SHAPES]
    laid_out = [(tiles.block(layer.weight), layer.bias.float()) for layer in layers]
    products = len(layers)
    print(f"\nall-MiniLM-L6-v2's four products per layer, {products // 4} layer(s)\n\n| threads | rows | tiles ms | "
          f"GFLOP/s | torch ms | tiles / torch |\n| ---: | ---: | ---: | ---: | ---: | ---: |")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for rows in args.rows:
            inputs = {k: torch.randn(rows, k).bfloat16() for k, _ in SHAPES}
            for layer, (blocked, bias) in zip(layers[:4], laid_out):
                x = inputs[layer.in_features]
                got = tiles.linear(x, blocked, bias, layer.out_features).float()
                exact = x.float() @ layer.weight.float().T + bias
                if not torch.allclose(got, exact, rtol=2 ** -7, atol=1e-2):
                    raise SystemExit(f"the tile products differ from float32's at {rows} x {layer.in_features}")

            def on_tiles():
                for layer, (blocked, bias) in zip(layers, laid_out):
                    tiles.linear(inputs[layer.in_features], blocked, bias, layer.out_features)

            @torch.no_grad()
            def on_torch():
                for layer in layers:
                    layer(inputs[layer.in_features])

            mine, theirs = best_ms(on_tiles, 5, warm_ups=1), best_ms(on_torch, 5, warm_ups=1)
            flops = products // 4 * sum(2 * rows * k * n for k, n in SHAPES)
            print(f"| {threads} | {rows} | {mine:.3f} | {flops / mine / 1e6:.0f} | {theirs:.3f} | "
                  f"{mine / theirs:.2f} |", flush=True)


if __name__ == "__main__":
    main()

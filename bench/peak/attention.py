"""The C attention kernels against what runs without them, on packed query | key | value rows of random values:

- float32 (kernels/c/attention.c, or attention_avx2.c on a CPU without AVX-512: the one that runs here) against
  torch's attention, one SDPA call per sequence (what model.attention runs without the kernel);
- bfloat16 (kernels/c/attention_bf16_amx.c on a CPU with AMX, else attention_bf16.c, AVX512-BF16) against the
  float32 kernel between a copy of qkv to float32 and one of its output back (what a bfloat16 network ran before it,
  and runs on a CPU without AVX512-BF16), against torch's own bfloat16 SDPA, and, where the AMX kernel runs, against
  the AVX512-BF16 loops.

    python -m bench.peak.attention                       # 12 heads of 32 (all-MiniLM-L6-v2), 1 and 2 threads
    python -m bench.peak.attention --dtype bfloat16
    python -m bench.peak.attention --heads 12 --head-dim 64
    python -m bench.peak.attention --lengths 128 192 224   # other lengths, batches of about 8,192 tokens
    python -m bench.peak.attention --threads 1 --repeats 30   # steadier figures on a shared machine

Each row: sequences of one length, the fastest of 5 calls (--repeats) after a warm-up, the arithmetic done a second
(QK^T and the weighted sum, 4 x length^2 x head width a sequence) and the largest difference from float32 SDPA on the
same inputs (for bfloat16, mostly the output's rounding).
"""

from __future__ import annotations

import argparse

import torch

from bench.serving.timing import best_ms
from kernels import attention, int8_reference


SEQUENCES = {32: 128, 96: 64, 150: 64, 256: 32, 512: 16}  # length: sequences in the batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--repeats", type=int, default=5,
                        help="calls timed a row, the fastest kept (more give steadier figures on a shared machine)")
    parser.add_argument("--lengths", type=int, nargs="+", default=list(SEQUENCES),
                        help="sequence lengths: the default ones in their batches (SEQUENCES), others in batches of "
                             "about 8,192 tokens")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, not {args.repeats}")
    kernel = attention.kernel()
    if kernel is None:
        raise SystemExit(f"no C attention kernel here: {attention.why_not()}")
    if args.dtype == "bfloat16" and attention.bfloat16_kernel() is None:
        raise SystemExit(f"no bfloat16 attention kernel here: {attention.bfloat16_kernel.why_not()}")
    dtype = getattr(torch, args.dtype)
    heads, head_dim = args.heads, args.head_dim
    peer = "torch SDPA" if dtype == torch.float32 else "float32 kernel + copies"
    # bfloat16: also torch's own bfloat16 SDPA, one call per sequence (what runs above the kernel's longest sequence
    # where the CPU has AMX: model.attention.torch_attention_dtype)
    own = " torch bfloat16 ms | C / torch bfloat16 |" if dtype == torch.bfloat16 else ""
    # bfloat16 on AMX's tiles: also the AVX512-BF16 loops the tiles replace (kernels/c/attention_bf16.c)
    loops = attention.bfloat16_loops_kernel() if dtype == torch.bfloat16 and \
        attention.bfloat16_kernel().instruction_set == "AMX" else None
    own += " AVX512-BF16 loops ms | C / loops |" if loops is not None else ""
    print(f"{heads} heads of {head_dim}, {args.dtype}\n\n| threads | tokens x sequences | C ms | GFLOP/s | {peer} ms | "
          f"C / {peer} | largest difference |{own}\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
          f"{' ---: | ---: |' * own.count('/')}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for length in args.lengths:
            count = SEQUENCES.get(length, max(1, 8192 // length))
            spans = [(index * length, length) for index in range(count)]
            qkv = torch.randn(count * length, 3 * heads * head_dim, generator=torch.Generator().manual_seed(0))
            qkv = qkv.to(dtype)
            if dtype == torch.float32:
                def before():
                    return int8_reference.sdpa_each(qkv, spans, heads, head_dim)
            else:
                def before():
                    return kernel.attend_spans(qkv.float(), spans, heads, head_dim).to(dtype)
            mine = best_ms(lambda: kernel.attend_spans(qkv, spans, heads, head_dim), args.repeats, warm_ups=1)
            theirs = best_ms(before, args.repeats, warm_ups=1)
            difference = (kernel.attend_spans(qkv, spans, heads, head_dim).float()
                          - int8_reference.sdpa_each(qkv.float(), spans, heads, head_dim)).abs().max()
            flops = 4 * count * heads * head_dim * length * length
            line = f"| {threads} | {length} x {count} | {mine:.2f} | {flops / mine / 1e6:.0f} | {theirs:.2f} | " \
                   f"{mine / theirs:.2f} | {difference:.1e} |"
            if own:
                torch_own = best_ms(lambda: int8_reference.sdpa_each(qkv, spans, heads, head_dim), args.repeats,
                                    warm_ups=1)
                line += f" {torch_own:.2f} | {mine / torch_own:.2f} |"
            if loops is not None:
                starts = torch.tensor([start for start, _ in spans])
                lengths = torch.full((count,), length)
                out = qkv.new_empty(qkv.shape[0], heads * head_dim)
                looped = best_ms(lambda: loops.attend(qkv, starts, lengths, length, heads, head_dim, out, threads),
                                 args.repeats, warm_ups=1)
                line += f" {looped:.2f} | {mine / looped:.2f} |"
            print(line, flush=True)


if __name__ == "__main__":
    main()

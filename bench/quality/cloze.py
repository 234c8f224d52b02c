"""A cloze probe of plain sentences: does a checkpoint's fill-mask answer them sensibly?

The sentences (bench/quality/data/cloze.tsv, written for this project: facts, syntax, common collocations) each
have one [MASK] and the answers a reader would accept. For each checkpoint: top-1 and top-5 hits, and
every sentence's top answers. Computed in-process the way /fill-mask computes them (softmax over the
whole vocabulary at the mask).

    python -m bench.quality.cloze checkpoints/minilm-wikipedia runs/mini-wikipedia-stage2 --markdown
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from model import load_checkpoint
from trainer.model_card import top_answers

PROBE = Path(__file__).with_name("data") / "cloze.tsv"


def read_probe(path: Path = PROBE) -> list[tuple[str, set[str]]]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            sentence, answers = line.split("\t")
            rows.append((sentence, {a.strip() for a in answers.split(",")}))
    return rows


def probe(directory: Path, top_k: int = 5) -> dict:
    checkpoint = load_checkpoint(directory)
    model, tokenizer = checkpoint.model.float().eval(), checkpoint.tokenizer
    rows, top1, top5 = [], 0, 0
    for sentence, answers in read_probe():
        top = top_answers(model, tokenizer, sentence, top_k)
        tokens = [token for token, _ in top]
        hit1, hit5 = tokens[0] in answers, any(t in answers for t in tokens)
        top1, top5 = top1 + hit1, top5 + hit5
        rows.append({"sentence": sentence, "top": [(t, round(p, 3)) for t, p in top],
                     "top1_hit": hit1, "top5_hit": hit5})
    return {"checkpoint": directory.name, "sentences": len(rows), "top1": top1 / len(rows), "top5": top5 / len(rows),
            "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", type=Path, nargs="+")
    parser.add_argument("--markdown", action="store_true", help="print a table per checkpoint instead of JSON")
    args = parser.parse_args()
    results = [probe(c) for c in args.checkpoints]
    if not args.markdown:
        print(json.dumps(results, indent=1))
        return
    for result in results:
        print(f"\n{result['checkpoint']}: top-1 {result['top1']:.0%}, top-5 {result['top5']:.0%} "
              f"of {result['sentences']} sentences\n")
        print("| sentence | top 5 | hit |\n| --- | --- | --- |")
        for row in result["rows"]:
            hit = "top-1" if row["top1_hit"] else "top-5" if row["top5_hit"] else ""
            print(f"| `{row['sentence']}` | {', '.join(t for t, _ in row['top'])} | {hit} |")


if __name__ == "__main__":
    main()

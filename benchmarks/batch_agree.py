"""Greedy answers of a running mlx-server served alone against the same requests served
together in one batch (stdlib only; benchmarks/gpu_session15.sh part `agree`).

Each of `--streams` requests asks the model to continue its own passage of `--text`
(greedy, `-g` tokens). They are sent one after the other (each decodes alone: a batch of
one row), then all at once (one batch of that many rows), `--rounds` times. On the CPU
both give the same tokens (the batched path keeps each row's arithmetic); on a GPU a
batch rounds its products differently from one row, so near-tied tokens may part: the
count of answers equal to the alone ones, and where the others part, is a quality check
of a batched path (docs/parity.md), run with and without the path's switch.

    python benchmarks/batch_agree.py --base-url http://127.0.0.1:8080 --streams 8 -g 64
"""

import argparse
import concurrent.futures as cf

from chat_stream import chat_stream, greedy_body
from predict_bench import passages


def ask(base, passage, g):
    return chat_stream(base, greedy_body(f"Continue this text:\n\n{passage}", g))["text"]


def common_prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("-g", type=int, default=64)
    ap.add_argument("--words", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--label", default="")
    ap.add_argument("--text", default="crates/mlx-quant/src/calibration.txt")
    a = ap.parse_args()
    texts = passages(a.text, a.streams, a.words)
    alone = [ask(a.base_url, t, a.g) for t in texts]
    for r in range(a.rounds):
        with cf.ThreadPoolExecutor(a.streams) as ex:
            together = list(ex.map(lambda t: ask(a.base_url, t, a.g), texts))
        same = sum(x == y for x, y in zip(alone, together))
        parts = [
            f"{common_prefix(x, y)}/{len(x)}"
            for x, y in zip(alone, together)
            if x != y
        ]
        print(
            f"{a.label} | {a.streams} streams | round {r} | {same} of {a.streams} "
            f"answers as alone | differing: chars in common / alone length: {' '.join(parts) or '-'}",
            flush=True,
        )


if __name__ == "__main__":
    main()

"""Structured-output speed of a running mlx-server (stdlib only; run by
benchmarks/gpu_structured.sh on the GPU machine).

For each concurrency level: N streaming chat requests at once, unconstrained and with a
JSON-schema constraint (an array of G/2 single-digit integers: a fixed answer length for
a random-weight model), decode tok/s = completion tokens of all streams / (last token -
first token of each stream, averaged), and wall tok/s = completion tokens of all streams /
(last stream's end - first stream's start: prefill included, and not moved by when a
stream's first content arrives, which random weights' partial UTF-8 tokens can delay). Then the time to first token of one request with
a 50-property schema (the first constrained request of a schema compiles it), against
the same request unconstrained. Prints a markdown table. With `--trials N` each
concurrency level runs N pairs, the order within a pair flipped every other trial (so a
drift of the machine's speed falls on both settings), and a line per level gives the
constrained / unconstrained decode ratio of each pair and their mean.

    python benchmarks/structured_bench.py --base-url http://127.0.0.1:8080 -g 128 --streams 1,32 [--trials 3]
"""

import argparse
import concurrent.futures as cf

from chat_stream import chat_stream, greedy_body


def body(g, schema, i):
    b = greedy_body(f"Write numbers ({i}).", g)
    if schema is not None:
        b["response_format"] = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    return b


def run(base, g, n, schema):
    with cf.ThreadPoolExecutor(n) as pool:
        res = list(pool.map(lambda i: chat_stream(base, body(g, schema, i)), range(n)))
    toks = sum(r["tokens"] for r in res)
    span = sum(r["decode_s"] for r in res) / len(res)
    wall = max(r["end"] for r in res) - min(r["t0"] for r in res)
    ttft = sum(r["ttft"] for r in res) / len(res)
    return toks, toks / span if span > 0 else float("nan"), ttft, toks / wall if wall > 0 else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--base-url", required=True)
    ap.add_argument("-g", type=int, default=128)
    ap.add_argument("--streams", default="1,32")
    ap.add_argument("--label", default="")
    ap.add_argument("--trials", type=int, default=1)
    args = ap.parse_args()
    items = max(2, args.g // 2 - 2)
    digits = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": items, "maxItems": items}
    wide = {
        "type": "object",
        "properties": {f"field_{k}": {"type": "integer", "minimum": 0, "maximum": 9} for k in range(50)},
        "required": [f"field_{k}" for k in range(50)],
        "additionalProperties": False,
    }
    run(args.base_url, 8, 1, None)  # warm-up
    run(args.base_url, 8, 1, digits)
    print(f"### structured output {args.label} (-g {args.g})\n")
    print("| streams | constraint | tokens | decode tok/s | mean TTFT (s) | wall tok/s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for n in [int(s) for s in args.streams.split(",")]:
        # A short round at this concurrency first: its batch shapes' kernels are compiled
        # there, not inside whichever timed run comes first (session 19: 1,234 tok/s
        # unconstrained, timed first, against 3,503 constrained).
        run(args.base_url, 8, n, None)
        run(args.base_url, 8, n, digits)
        ratios = []
        for trial in range(args.trials):
            pair = [("none", None), ("JSON schema", digits)]
            if trial % 2:
                pair.reverse()
            tps_of = {}
            for name, schema in pair:
                toks, tps, ttft, wall = run(args.base_url, args.g, n, schema)
                tps_of[name] = tps
                print(f"| {n} | {name} | {toks} | {tps:.1f} | {ttft:.3f} | {wall:.1f} |", flush=True)
            ratios.append(tps_of["JSON schema"] / tps_of["none"])
        if args.trials > 1:
            summary = ", ".join(f"{r:.3f}" for r in ratios)
            print(f"| {n} | ratio schema / none | {summary} | mean {sum(ratios) / len(ratios):.3f} | | |", flush=True)
    plain = chat_stream(args.base_url, body(8, None, 0))["ttft"]
    first = chat_stream(args.base_url, body(args.g * 4, wide, 1))["ttft"]
    again = chat_stream(args.base_url, body(args.g * 4, wide, 2))["ttft"]
    print(f"\nTTFT, 50-property schema: {first:.3f} s (first request), {again:.3f} s (again); unconstrained {plain:.3f} s")


if __name__ == "__main__":
    main()

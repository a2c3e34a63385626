"""Time to first token of a server for prompts of many lengths (issue 21).

A server on MLX's CUDA backend builds a cuDNN plan for every attention shape it has not
seen (~45 ms on the H200, GPU.md session 13): a benchmark whose prompts all have one
length pays it once, a real server's prompts of every length pay it again and again.
This sends one request at a time (`max_tokens` 1, greedy, `/v1/completions`), each with
a prompt of another length (`--lengths` evenly spread from `--min` to `--max` words,
twice over unless `--once`: the second pass, with other first words so that no prompt
cache helps, finds every length's plan built), and
prints the median and mean request times of each pass. `--same` gives every request the
first length instead (the control: one shape). Any OpenAI-compatible server.

    python benchmarks/ttft_lengths.py --base-url http://127.0.0.1:8080 --label ours
"""

import argparse
import json
import statistics
import time
import urllib.request


def request(base_url, model, prompt):
    body = json.dumps(
        {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0}
    ).encode()
    req = urllib.request.Request(
        base_url + "/v1/completions", body, {"Content-Type": "application/json"}
    )
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        reply = json.loads(r.read())
    elapsed = time.perf_counter() - start
    if not reply.get("choices"):
        raise SystemExit(f"no choices in the reply: {reply}")
    return elapsed


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", default="http://127.0.0.1:8080")
    p.add_argument("--model", default="default_model")
    p.add_argument("--lengths", type=int, default=24)
    p.add_argument("--min", type=int, default=40)
    p.add_argument("--max", type=int, default=1500)
    p.add_argument("--same", action="store_true")
    p.add_argument("--once", action="store_true")
    p.add_argument("--label", default="")
    a = p.parse_args()
    if a.lengths < 1 or a.min < 1 or a.max < a.min:
        raise SystemExit("--lengths >= 1 and 1 <= --min <= --max")
    step = (a.max - a.min) / max(1, a.lengths - 1)
    words = [a.min + round(i * step) for i in range(a.lengths)]
    if a.same:
        words = [words[0]] * a.lengths
    # Warm the server up with a length outside the ones timed.
    request(a.base_url, a.model, "warm " * (a.min // 2 + 1))
    passes = 1 if a.once else 2
    for n in range(passes):
        # Each prompt starts with its pass and index, so that no prompt cache serves one
        # request another's prefix; the same words otherwise (the same lengths each pass).
        times = [
            request(
                a.base_url,
                a.model,
                f"{n} {i}: " + "the cat sat on the mat " * (w // 6 + 1),
            )
            for i, w in enumerate(words)
        ]
        print(
            f"{a.label} pass {n + 1} {'same length' if a.same else 'new lengths'}: "
            f"{len(times)} requests, median {statistics.median(times) * 1e3:.1f} ms, "
            f"mean {statistics.mean(times) * 1e3:.1f} ms, max {max(times) * 1e3:.1f} ms"
        )


if __name__ == "__main__":
    main()

"""Speculation inside the batching server without a draft model: OpenAI predicted
outputs (`prediction: {"type": "content", ...}`, drafted by prompt lookup against the
given text) against the same requests without a prediction, on a running mlx-server
(stdlib only; run by benchmarks/gpu_session15.sh part `predsrv` on the GPU machine, or
here on the CPU).

Each stream asks the model to repeat a passage of `--text` (a different passage a
stream, greedy). `--predict source` predicts the passage itself (what a client editing a
document sends: real acceptance, set by how faithfully the model copies); `--predict
self` predicts the answer the same request gave without a prediction (the best case:
with random weights nothing else is accepted); `--mix` predicts every other stream only
(a server with both kinds of requests). For each concurrency level, `--trials`
pairs (plain / predicted, order flipped every other pair): wall tok/s = completion
tokens of all streams / (last stream's end - first stream's start, prefill included),
decode tok/s = completion tokens / mean (last content - first content) a stream, the
mean time to first content, the accepted / rejected prediction tokens from
`usage.completion_tokens_details`, and how many predicted answers differ from the plain
ones (greedy: speculation emits the target's own tokens, so a difference is a
batch-shape rounding difference or a bug).

`--sustain SECONDS` measures a closed loop instead: each stream sends request after
request (a new passage each) for that long, predicted or plain, and the figure is the
completion tokens of all requests over the time to the last one's end, with the mean
latency a request. One burst's wall time is set by its slowest stream (a passage the
model does not copy keeps the batch's verification steps to its end); a loaded server's
throughput is not.

    python benchmarks/predict_bench.py --base-url http://127.0.0.1:8080 -g 128 \\
        --streams 1,8,32 --trials 2 --predict source
"""

import argparse
import concurrent.futures as cf
import time

from chat_stream import chat_stream, greedy_body


def chat(base, body):
    r = chat_stream(base, body)
    details = r["usage"].get("completion_tokens_details") or {}
    r["accepted"] = details.get("accepted_prediction_tokens", 0)
    r["rejected"] = details.get("rejected_prediction_tokens", 0)
    return r


def passages(path, n, words):
    """`n` passages of about `words` words each, cut from the text at `path` (wrapping)."""
    with open(path, encoding="utf-8") as f:
        all_words = f.read().split()
    if not all_words:
        raise SystemExit(f"{path} has no text")
    return [" ".join(all_words[(i * words + j) % len(all_words)] for j in range(words)) for i in range(n)]


def body(g, passage, prediction=None, k=None):
    b = greedy_body(f"Repeat this text exactly:\n\n{passage}", g)
    if prediction is not None:
        b["prediction"] = {"type": "content", "content": prediction}
        if k is not None:
            b["num_draft_tokens"] = k
    return b


def run(base, bodies):
    with cf.ThreadPoolExecutor(len(bodies)) as pool:
        res = list(pool.map(lambda b: chat(base, b), bodies))
    toks = sum(r["tokens"] for r in res)
    span = sum(r["decode_s"] for r in res) / len(res)
    wall = max(r["end"] for r in res) - min(r["t0"] for r in res)
    return {
        "res": res,
        "tokens": toks,
        "decode": toks / span if span > 0 else float("nan"),
        "wall": toks / wall if wall > 0 else float("nan"),
        "ttft": sum(r["ttft"] for r in res) / len(res),
        "accepted": sum(r["accepted"] for r in res),
        "rejected": sum(r["rejected"] for r in res),
    }


def pairs(n, trials, measure, show, figure, what, blanks):
    """`trials` plain / predicted pairs at `n` streams, the order flipped every other pair:
    `measure(arm)` runs one arm ("plain" or "predicted") and `show(arm, result)` prints its
    row; then a row of the ratios of the results' `figure`, predicted / plain (`what`),
    closed by `blanks`."""
    ratios = []
    for trial in range(trials):
        arms = ["plain", "predicted"]
        if trial % 2:
            arms.reverse()
        got = {}
        for arm in arms:
            got[arm] = measure(arm)
            show(arm, got[arm])
        ratios.append(got["predicted"][figure] / got["plain"][figure])
    summary = ", ".join(f"{x:.3f}" for x in ratios)
    print(f"| {n} | ratio predicted / plain ({what}) | {summary} | mean {sum(ratios) / len(ratios):.3f} |{blanks}",
          flush=True)


def sustain(base, pools, seconds):
    """A closed loop for `seconds`: worker i sends the bodies of `pools[i]` in turn, each
    after the last one's answer, and starts none after the deadline (the ones in flight
    finish). A request's stream ending early no longer leaves the batch with fewer rows,
    so the figure is the server's steady throughput, not one burst's slowest stream."""
    t0 = time.perf_counter()
    deadline = t0 + seconds

    def worker(pool):
        done, k = [], 0
        while time.perf_counter() < deadline:
            done.append(chat(base, pool[k % len(pool)]))
            k += 1
        return done

    with cf.ThreadPoolExecutor(len(pools)) as ex:
        res = [r for rs in ex.map(worker, pools) for r in rs]
    end = max(r["end"] for r in res)
    toks = sum(r["tokens"] for r in res)
    return {
        "requests": len(res),
        "tokens": toks,
        "tps": toks / (end - t0),
        "latency": sum(r["end"] - r["t0"] for r in res) / len(res),
        "accepted": sum(r["accepted"] for r in res),
        "rejected": sum(r["rejected"] for r in res),
    }


def main_sustained(args, levels):
    """`--sustain`: plain / predicted pairs of closed loops at each concurrency level."""
    # A different passage for every request a worker sends (8 a worker, then again).
    texts = passages(args.text, max(levels) * 8, args.words)
    print(f"### predicted outputs {args.label} (-g {args.g}, prediction: source"
          f"{', every other stream' if args.mix else ''}, sustained {args.sustain:g} s a run, "
          f"num_draft_tokens {args.num_draft_tokens or 'default'})\n")
    print("| streams | arm | requests | tokens | tok/s | mean latency s | accepted / rejected |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for n in levels:
        def pools(predicted):
            return [[body(args.g, t, t if predicted and (not args.mix or i % 2 == 0) else None,
                          args.num_draft_tokens)
                     for t in texts[i::n]] for i in range(n)]
        # Untimed: this level's batch shapes are compiled here.
        sustain(base=args.base_url, pools=pools(True), seconds=min(args.sustain, 5.0))
        def show(arm, r):
            acc = f"{r['accepted']} / {r['rejected']}" if arm == "predicted" else ""
            print(f"| {n} | {arm} | {r['requests']} | {r['tokens']} | {r['tps']:.1f} | {r['latency']:.3f} | {acc} |", flush=True)

        pairs(n, args.trials, lambda arm: sustain(args.base_url, pools(arm == "predicted"), args.sustain),
              show, "tps", "tok/s", " | | |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", required=True)
    ap.add_argument("-g", type=int, default=128)
    ap.add_argument("--streams", default="1,8,32")
    ap.add_argument("--trials", type=int, default=1)
    ap.add_argument("--predict", choices=["source", "self"], default="source")
    ap.add_argument("--text", default="crates/mlx-quant/src/calibration.txt")
    ap.add_argument("--words", type=int, default=60, help="words a passage")
    ap.add_argument("--num-draft-tokens", type=int, default=None, help="the request's num_draft_tokens (server default when unset)")
    ap.add_argument("--mix", action="store_true",
                    help="the predicted arm predicts every other stream only (the rest plain): a mixed workload")
    ap.add_argument("--label", default="")
    ap.add_argument("--sustain", type=float, default=0.0,
                    help="seconds of a closed loop a run (each stream sends its next request when "
                         "its last one ends) instead of one burst of a request a stream; "
                         "with --predict source")
    args = ap.parse_args()
    levels = [int(s) for s in args.streams.split(",")]
    if args.sustain > 0:
        if args.predict != "source":
            raise SystemExit("--sustain predicts the source passages (--predict source)")
        return main_sustained(args, levels)
    texts = passages(args.text, max(levels), args.words)
    base = args.base_url
    print(f"### predicted outputs {args.label} (-g {args.g}, prediction: {args.predict}"
          f"{', every other stream' if args.mix else ''}, "
          f"num_draft_tokens {args.num_draft_tokens or 'default'})\n")
    print("| streams | arm | tokens | wall tok/s | decode tok/s | mean TTFT s | accepted / rejected | answers differing |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for n in levels:
        plain_bodies = [body(args.g, t) for t in texts[:n]]
        # Untimed: this level's batch shapes are compiled here, and `self` takes its
        # predictions from these answers.
        warm = run(base, plain_bodies)
        answers = [r["text"] for r in warm["res"]]
        preds = texts[:n] if args.predict == "source" else answers
        pred_bodies = [
            body(args.g, t, p if not args.mix or i % 2 == 0 else None, args.num_draft_tokens)
            for i, (t, p) in enumerate(zip(texts[:n], preds))
        ]
        run(base, pred_bodies)
        def show(arm, r):
            differ = sum(x["text"] != a for x, a in zip(r["res"], answers))
            acc = f"{r['accepted']} / {r['rejected']}" if arm == "predicted" else ""
            print(f"| {n} | {arm} | {r['tokens']} | {r['wall']:.1f} | {r['decode']:.1f} | {r['ttft']:.3f} | {acc} | {differ} |", flush=True)

        bodies = {"plain": plain_bodies, "predicted": pred_bodies}
        pairs(n, args.trials, lambda arm: run(base, bodies[arm]), show, "wall", "wall", " | | | |")


if __name__ == "__main__":
    main()

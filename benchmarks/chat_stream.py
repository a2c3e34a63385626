"""One streaming chat completion against a running server (stdlib only), shared by
structured_bench.py and predict_bench.py."""

import json
import time
import urllib.request


def chat_stream(base, body):
    """POSTs `body` to `{base}/v1/chat/completions` as a stream with usage and reads it to
    the end: the content text, the final usage, the time to first content, the span from
    first to last content, and the request's start and end (perf_counter seconds)."""
    req = urllib.request.Request(
        f"{base}/v1/chat/completions",
        data=json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    t0 = time.perf_counter()
    first = last = None
    text, usage = [], {}
    with urllib.request.urlopen(req, timeout=900) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk.get("choices", []):
                piece = c.get("delta", {}).get("content")
                if piece:
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    text.append(piece)
    end = time.perf_counter()
    return {
        "text": "".join(text),
        "usage": usage,
        "tokens": usage.get("completion_tokens", 0),
        "ttft": (first or t0) - t0,
        "decode_s": (last or t0) - (first or t0),
        "t0": t0,
        "end": end,
    }


def greedy_body(content, g):
    """A greedy chat request of one user message and at most `g` tokens (the benchmarks'
    common body; callers add their own fields)."""
    return {
        "model": "default_model",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": g,
        "temperature": 0,
    }

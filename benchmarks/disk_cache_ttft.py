#!/usr/bin/env python3
"""Time to first token of a long prompt right after an mlx-server restart, with and
without the prompt cache's disk tier (--prompt-cache-dir).

For each mode and each run: start the server, send the prompt once (max_tokens 1; with
the disk tier this writes the cache file), stop it (SIGTERM: queued writes finish),
start it again, then time one streaming request with the same prompt from sending it
to the first content chunk. Reports the median and the cached_tokens the server
reported for that request. Standard library only.

  python3 benchmarks/disk_cache_ttft.py --bin target/release/mlx-server \\
      [--model M] [--tokens 4000] [--runs 3] [--out FILE.md] [-- EXTRA SERVER ARGS]
"""
import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

PARAGRAPH = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, counting "
    "the steps, checking the brass fittings and the wick, and writing in the log the "
    "state of the sea, the wind, the ships that passed and the birds that rested on "
    "the rail before the long flight south. "
)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body, timeout=600):
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


class Server:
    def __init__(self, args, cache_dir, log):
        self.log = log.name
        self.port = free_port()
        cmd = [args.bin, "--port", str(self.port)]
        if args.model:
            cmd += ["--model", args.model]
        if cache_dir:
            cmd += ["--prompt-cache-dir", cache_dir]
        cmd += args.extra
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=log)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 600
        while time.time() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"the server exited with {self.proc.returncode}; see {self.log}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2):
                    return
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.2)
        sys.exit("the server did not start")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def first_token_seconds(url, prompt):
    """Seconds from sending a streaming completion to its first content chunk, and the
    usage's cached_tokens / prompt_tokens."""
    body = {
        "prompt": prompt,
        "max_tokens": 2,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    req = urllib.request.Request(
        url + "/v1/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    tic = time.perf_counter()
    ttft, usage = None, {}
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            event = json.loads(line[5:])
            if ttft is None and event.get("choices"):
                ttft = time.perf_counter() - tic
            if event.get("usage"):
                usage = event["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return ttft, cached, usage.get("prompt_tokens", 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="target/release/mlx-server")
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=4000, help="approximate prompt tokens")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=None, help="append the markdown block here")
    ap.add_argument("extra", nargs="*", help="more mlx-server arguments (after --)")
    args = ap.parse_args()

    # About 55 tokens per paragraph with common tokenizers; numbered so no two repeat.
    n = max(1, args.tokens // 55)
    prompt = "".join(f"{i}. {PARAGRAPH}" for i in range(n))
    work = tempfile.mkdtemp(prefix="disk-cache-ttft-")
    log_path = os.path.join(work, "server.log")
    rows = []
    with open(log_path, "w") as log:
        for mode in ("memory only", "disk tier"):
            ttfts, cached, ptoks = [], [], 0
            for _ in range(args.runs):
                cache_dir = None
                if mode == "disk tier":
                    cache_dir = os.path.join(work, "cache")
                    shutil.rmtree(cache_dir, ignore_errors=True)
                s = Server(args, cache_dir, log)
                post(s.url + "/v1/completions", {"prompt": prompt, "max_tokens": 1})
                s.stop()
                s = Server(args, cache_dir, log)
                t, c, ptoks = first_token_seconds(s.url, prompt)
                s.stop()
                ttfts.append(t)
                cached.append(c)
            rows.append((mode, ptoks, statistics.median(ttfts), ttfts, cached))
    lines = [
        f"TTFT after a restart: `{args.bin}` model `{args.model or 'default'}` "
        f"extra {args.extra}, {args.runs} run(s) each",
        "",
        "| mode | prompt tokens | cached tokens | TTFT median (s) | runs (s) |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for mode, ptoks, med, ts, cached in rows:
        runs = ", ".join(f"{t:.3f}" for t in ts)
        lines.append(f"| {mode} | {ptoks} | {max(cached)} | {med:.3f} | {runs} |")
    if rows[1][2] > 0:
        lines.append("")
        lines.append(f"Speed-up of the disk tier: {rows[0][2] / rows[1][2]:.1f}x")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write(text + "\n")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Counts the primitives of one decoding step's graph, ours against mlx-lm's.

    python benchmarks/graph_nodes.py count FILE.dot
    python benchmarks/graph_nodes.py mlx-lm MODEL_DIR OUT.dot [PROMPT_TOKENS]
    python benchmarks/graph_nodes.py mlx-lm-prefill MODEL_DIR OUT.dot [PROMPT_TOKENS]

Ours: `DECODE_BUILD_DOT=ours.dot decode_build MODEL_DIR PROMPT 1` (mlx-engine's example)
writes the graph of its first decode step (model forward, log-probabilities, argmax).
`mlx-lm` builds the same step the way `mlx_lm.generate.generate_step` does after a
prefill of PROMPT_TOKENS tokens and writes it with `mx.export_to_dot`. With
`mlx-lm-prefill` (ours: `DECODE_BUILD_PREFILL_DOT=ours.dot decode_build MODEL_DIR PROMPT`)
the graph is the prefill's: PROMPT - 1 tokens into fresh caches, up to the caches' state,
as `generate_step` evaluates it. Every primitive
node is work MLX schedules and encodes on each token (benchmarks/GPU.md run 3: ~0.5 us
for a view, ~3 us for a kernel on the H200's host).
"""
import collections
import re
import sys


def count(path):
    labels = re.findall(r'\[label ="([^"]+)", shape=rectangle\]', open(path).read())
    hist = collections.Counter(labels)
    print(f"{path}: {len(labels)} primitives")
    for name, n in hist.most_common():
        print(f"  {n:5d}  {name}")
    return hist


def mlx_lm_step(model_dir, out, prompt):
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load_model

    model, _ = load_model(__import__("pathlib").Path(model_dir))
    cache = make_prompt_cache(model)
    ids = mx.array([[(i * 7919) % 1000 for i in range(prompt)]])
    mx.eval(model(ids, cache=cache))
    mx.eval([c.state for c in cache])
    y = mx.array([1])
    logits = model(y[None], cache=cache)[:, -1, :]
    logprobs = logits - mx.logsumexp(logits, keepdims=True)
    sampled = mx.argmax(logprobs, axis=-1)
    mx.export_to_dot(out, sampled, logprobs.squeeze(0))
    return count(out)


def mlx_lm_prefill(model_dir, out, prompt):
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load_model

    model, _ = load_model(__import__("pathlib").Path(model_dir))
    cache = make_prompt_cache(model)
    n = max(prompt - 1, 1)
    ids = mx.array([[(i * 7919) % 1000 for i in range(n)]])
    model(ids, cache=cache)
    # A cache's state may nest (ArraysCache: ([conv window, recurrent state], None,
    # None)); generate_step's mx.eval walks the tree, so take every array in it.
    from mlx.utils import tree_flatten

    state = [a for _, a in tree_flatten([c.state for c in cache]) if isinstance(a, mx.array)]
    mx.export_to_dot(out, *state)
    return count(out)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "count":
        count(sys.argv[2])
    elif len(sys.argv) >= 4 and sys.argv[1] == "mlx-lm-prefill":
        mlx_lm_prefill(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 512)
    elif len(sys.argv) >= 4 and sys.argv[1] == "mlx-lm":
        mlx_lm_step(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 128)
    else:
        sys.exit(__doc__)

"""Oracle for mlx-sample: runs mlx-lm's samplers and logits processors
(mlx_lm/sample_utils.py) on fixed inputs and records their outputs.

Usage: python xtask/py/sample_oracle.py [OUT_DIR]   (default goldens/sample)

Writes `sampling.safetensors`:
  - inputs "logprobs.{j}" ([B, V] log-probabilities as generate_step makes them:
    logits - logsumexp(logits));
  - "tokens.{c}": the tokens `make_sampler(**kw)` draws after `mx.random.seed(seed)`
    over `steps` calls cycling through the inputs;
  - "filter.{c}": outputs of the single steps (apply_top_p, ...);
and `processors.safetensors`: "proc.{c}" outputs of make_logits_processors(**kw)
applied to "logits.{j}" with history "history.{h}". Case lists are JSON in the
metadata key "cases".
"""

import json
import os
import sys

import mlx.core as mx
import numpy as np
from mlx_lm.sample_utils import (
    apply_min_p,
    apply_top_k,
    apply_top_p,
    apply_xtc,
    categorical_sampling,
    make_logits_processors,
    make_sampler,
)


def logprob_inputs():
    rng = np.random.RandomState(0)
    out = {}
    specs = [((1, 64), mx.float32, 3.0), ((2, 1000), mx.float32, 2.0),
             ((1, 512), mx.bfloat16, 4.0), ((1, 300), mx.float16, 1.0)]
    for j, (shape, dt, scale) in enumerate(specs):
        logits = mx.array((rng.standard_normal(shape) * scale).astype(np.float32)).astype(dt)
        out[f"logprobs.{j}"] = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    mx.eval(out)
    return out


SAMPLER_CASES = [
    {"temp": 0.0},
    {"temp": 0.0, "top_k": 5, "top_p": 0.5},
    {"temp": 1.0},
    {"temp": 0.7},
    {"temp": 1.3},
    {"temp": 0.8, "top_p": 0.9},
    {"temp": 1.0, "top_p": 0.5},
    {"temp": 1.0, "top_p": 1.0},
    {"temp": 0.8, "min_p": 0.05},
    {"temp": 1.0, "min_p": 0.2, "min_tokens_to_keep": 4},
    {"temp": 1.0, "top_k": 10},
    {"temp": 2.0, "top_k": 1},
    {"temp": 1.0, "xtc_probability": 0.5, "xtc_threshold": 0.05},
    {"temp": 1.0, "xtc_probability": 1.0, "xtc_threshold": 0.01,
     "xtc_special_tokens": [0, 3, 7]},
    {"temp": 0.6, "top_p": 0.95, "min_p": 0.02, "top_k": 40},
    {"temp": 0.9, "top_p": 0.8, "min_p": 0.01, "min_tokens_to_keep": 3, "top_k": 50,
     "xtc_probability": 0.3, "xtc_threshold": 0.02, "xtc_special_tokens": [1, 2]},
]

FILTER_CASES = [
    ("top_p", 0.9), ("top_p", 0.3), ("top_p", 0.999),
    ("min_p", 0.1, 1), ("min_p", 0.5, 3), ("min_p", 1.0, 1),
    ("top_k", 1), ("top_k", 17),
    ("xtc", 1.0, 0.05, []), ("xtc", 0.5, 0.1, [2]), ("xtc", 0.0, 0.2, []),
    ("categorical", 0.5), ("categorical", 1.0),
]


def apply_filter(case, lp):
    kind = case[0]
    if kind == "top_p":
        return apply_top_p(lp, case[1])
    if kind == "min_p":
        return apply_min_p(lp, case[1], case[2])
    if kind == "top_k":
        return apply_top_k(lp, case[1])
    if kind == "xtc":
        return apply_xtc(lp, case[1], case[2], case[3])
    if kind == "categorical":
        return categorical_sampling(lp, case[1])
    raise ValueError(kind)


def sampling_golden(out_dir):
    inputs = logprob_inputs()
    arrays = dict(inputs)
    n_in = len(inputs)
    cases = []
    c = 0
    for kw in SAMPLER_CASES:
        for j in range(n_in):
            seed = 1000 + c
            steps = 12
            mx.random.seed(seed)
            sampler = make_sampler(**kw)
            toks = [sampler(inputs[f"logprobs.{j}"]) for _ in range(steps)]
            arrays[f"tokens.{c}"] = mx.stack(toks)
            cases.append({"kind": "sampler", "params": kw, "input": j, "seed": seed,
                          "steps": steps})
            c += 1
    filters = []
    f = 0
    for case in FILTER_CASES:
        for j in range(n_in):
            seed = 5000 + f
            mx.random.seed(seed)
            arrays[f"filter.{f}"] = apply_filter(case, inputs[f"logprobs.{j}"])
            filters.append({"case": list(case), "input": j, "seed": seed})
            f += 1
    mx.eval(arrays)
    meta = {"cases": json.dumps(cases), "filters": json.dumps(filters)}
    mx.save_safetensors(os.path.join(out_dir, "sampling.safetensors"), arrays, meta)


PROCESSOR_CASES = [
    {"logit_bias": {3: 2.5, 10: -100.0, 0: 0.3333}},
    {"repetition_penalty": 1.3},
    {"repetition_penalty": 0.7, "repetition_context_size": 4},
    {"repetition_penalty": 1.1, "repetition_context_size": 0},
    {"presence_penalty": 0.5},
    {"presence_penalty": -0.25, "presence_context_size": 3},
    {"frequency_penalty": 0.5},
    {"frequency_penalty": 0.3, "frequency_context_size": 5},
    {"logit_bias": {5: 1.0}, "repetition_penalty": 1.2, "presence_penalty": 0.4,
     "frequency_penalty": 0.1, "frequency_context_size": 50},
    {"repetition_penalty": 0.0, "presence_penalty": 0.0},
]


def processors_golden(out_dir):
    rng = np.random.RandomState(1)
    arrays = {}
    logits_specs = [((1, 40), mx.float32), ((2, 40), mx.bfloat16), ((1, 40), mx.float16)]
    for j, (shape, dt) in enumerate(logits_specs):
        arrays[f"logits.{j}"] = mx.array(
            (rng.standard_normal(shape) * 3).astype(np.float32)).astype(dt)
    histories = [
        mx.array([], dtype=mx.uint32),
        mx.array([3, 7, 7, 1, 3, 3, 20, 39], dtype=mx.uint32),
        mx.array(rng.randint(0, 40, size=60), dtype=mx.uint32),
        mx.array([5, 5, 5, 5], dtype=mx.int32),
    ]
    for h, t in enumerate(histories):
        arrays[f"history.{h}"] = t
    cases = []
    c = 0
    for kw in PROCESSOR_CASES:
        for j in range(len(logits_specs)):
            for h in range(len(histories)):
                procs = make_logits_processors(**kw)
                logits = arrays[f"logits.{j}"]
                # Processors may write into `logits` in place: work on a copy.
                out = mx.array(logits)
                for p in procs:
                    out = p(arrays[f"history.{h}"], out)
                arrays[f"proc.{c}"] = mx.array(out)
                params = dict(kw)
                if "logit_bias" in params:
                    params["logit_bias"] = [[k, v] for k, v in params["logit_bias"].items()]
                cases.append({"params": params, "logits": j, "history": h,
                              "n_processors": len(procs)})
                c += 1
    mx.eval(arrays)
    mx.save_safetensors(os.path.join(out_dir, "processors.safetensors"), arrays,
                        {"cases": json.dumps(cases)})


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join("goldens", "sample")
    os.makedirs(out_dir, exist_ok=True)
    sampling_golden(out_dir)
    processors_golden(out_dir)


if __name__ == "__main__":
    main()

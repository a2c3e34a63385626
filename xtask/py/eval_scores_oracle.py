"""mlx-lm 0.32.2's evaluate.py scoring on fixed inputs, for crates/mlx-eval/tests/scoring.rs.

Reads a JSON case from stdin: {"model": DIR, "chat": bool, "max_tokens": int|null,
"batch_size": int, "score": [[ids...]...], "step_size": int,
"loglikelihood": [[context, continuation]...], "rolling": [text...], "generate": [[context, gen_kwargs]...]} and prints
{"score": {"scores": [[repr...]], "is_greedy": [[bool]]}, "loglikelihood": [[repr, bool]],
"rolling": [repr...], "generate": [text...]} with floats as Python reprs (exact round trip, -inf included).

mlx_lm/evaluate.py imports lm_eval at module level; where lm_eval is not installed a
stand-in with the two names it uses (LM, register_model) takes its place.
"""
import contextlib
import json
import sys
import types
from types import SimpleNamespace

try:
    import lm_eval  # noqa: F401
except ImportError:
    stub = types.ModuleType("lm_eval")
    api = types.ModuleType("lm_eval.api")
    model = types.ModuleType("lm_eval.api.model")
    registry = types.ModuleType("lm_eval.api.registry")

    class LM:
        def __init__(self):
            pass

    model.LM = LM
    registry.register_model = lambda *names: (lambda cls: cls)
    stub.api = api
    api.model = model
    api.registry = registry
    sys.modules.update(
        {
            "lm_eval": stub,
            "lm_eval.api": api,
            "lm_eval.api.model": model,
            "lm_eval.api.registry": registry,
        }
    )

import mlx.core as mx  # noqa: E402
from mlx_lm.evaluate import MLXLM  # noqa: E402


def main():
    case = json.load(sys.stdin)
    lm = MLXLM(
        case["model"],
        max_tokens=case.get("max_tokens"),
        batch_size=case.get("batch_size", 8),
        use_chat_template=case.get("chat", False),
    )
    out = {}
    if case.get("score"):
        scores, lengths, ig = lm._score_fn(
            [tuple(x) for x in case["score"]], step_size=case.get("step_size", 2048)
        )
        out["score"] = {
            "scores": [[repr(v) for v in row] for row in scores.tolist()],
            "is_greedy": ig.tolist(),
            "lengths": lengths.tolist(),
        }
    if case.get("loglikelihood"):
        reqs = [SimpleNamespace(args=tuple(r)) for r in case["loglikelihood"]]
        out["loglikelihood"] = [
            [repr(float(s)), bool(g)] for s, g in lm.loglikelihood(reqs)
        ]
    if case.get("rolling"):
        reqs = [SimpleNamespace(args=(t,)) for t in case["rolling"]]
        out["rolling"] = [repr(float(s)) for s in lm.loglikelihood_rolling(reqs)]
    if case.get("generate"):
        reqs = [SimpleNamespace(args=(c, k)) for c, k in case["generate"]]
        # batch_generate(verbose=True) prints its progress to stdout.
        with contextlib.redirect_stdout(sys.stderr):
            out["generate"] = lm.generate_until(reqs)
    mx.eval(mx.array(0))
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()

"""mlx-evaluate's bridge into lm-evaluation-harness (run by the mlx-evaluate binary).

Registers an lm_eval model class whose requests are answered by the Rust parent over a
JSON-lines pipe: one request object per line on the original stdout, one reply per line
on stdin. lm_eval's own printing is moved to stderr so it cannot mix with the pipe.
Then runs lm_eval.simple_evaluate with mlx_lm.evaluate's arguments and hands back the
results file text (json.dumps(results["results"], indent=4), as mlx-lm writes it).

    python lm_eval_adapter.py '<json arguments>'
"""
import json
import os
import sys

_pipe_out = os.fdopen(os.dup(1), "w", encoding="utf-8")
os.dup2(2, 1)
sys.stdout = sys.stderr

try:
    from importlib.metadata import version

    import lm_eval
    from lm_eval.api.model import LM
    from lm_eval.tasks import TaskManager
except ImportError as e:
    sys.stderr.write(
        f"mlx-evaluate: the Python package lm_eval (lm-evaluation-harness) cannot be "
        f"imported by {sys.executable}: {e}. Install it (`pip install lm-eval`) or point "
        f"--python / MLX_EVAL_PYTHON at an interpreter that has it.\n"
    )
    sys.exit(3)


def _call(method, **kw):
    _pipe_out.write(json.dumps({"method": method, **kw}, default=str) + "\n")
    _pipe_out.flush()
    line = sys.stdin.readline()
    if not line:
        raise SystemExit("mlx-evaluate: the engine closed the pipe")
    reply = json.loads(line)
    if "error" in reply:
        raise SystemExit(f"mlx-evaluate: {reply['error']}")
    return reply["result"]


class MLXBridge(LM):
    def __init__(self, tokenizer_name):
        super().__init__()
        self._tokenizer_name = tokenizer_name

    @property
    def tokenizer_name(self) -> str:
        return self._tokenizer_name

    def apply_chat_template(self, chat_history, add_generation_prompt=True) -> str:
        return _call(
            "apply_chat_template",
            messages=chat_history,
            add_generation_prompt=add_generation_prompt,
        )

    def loglikelihood(self, requests):
        out = _call("loglikelihood", requests=[list(r.args) for r in requests])
        return [(float(s), bool(g)) for s, g in out]

    def loglikelihood_rolling(self, requests):
        out = _call("loglikelihood_rolling", requests=[r.args[0] for r in requests])
        return [float(s) for s in out]

    def generate_until(self, requests):
        return _call(
            "generate_until", requests=[[r.args[0], r.args[1]] for r in requests]
        )


def main():
    args = json.loads(sys.argv[1])
    hello = _call("hello")
    task_manager = None
    if args.get("include_path"):
        task_manager = TaskManager(include_path=args["include_path"])
    lm = MLXBridge(hello["tokenizer_name"])
    seed = args["seed"]
    results = lm_eval.simple_evaluate(
        model=lm,
        tasks=args["tasks"],
        fewshot_as_multiturn=args["fewshot_as_multiturn"],
        apply_chat_template=hello["use_chat_template"],
        num_fewshot=args["num_shots"],
        limit=args["limit"],
        random_seed=seed,
        numpy_random_seed=seed,
        torch_random_seed=seed,
        fewshot_random_seed=seed,
        confirm_run_unsafe_code=args["confirm_run_unsafe_code"],
        task_manager=task_manager,
    )
    _call(
        "results",
        text=json.dumps(results["results"], indent=4),
        each=[json.dumps(r, indent=4) for r in results["results"].values()],
        lm_eval_version=version("lm_eval"),
    )


if __name__ == "__main__":
    main()

"""Runs mlx-lm 0.32.2's `mlx_lm.evaluate` (its own main()) with one addition for tests:
`--include-path DIR` (which mlx-lm lacks) hands lm_eval a TaskManager that knows the
local task definitions in DIR. Everything else is mlx-lm's flags and behaviour.

    python xtask/py/eval_mlx_lm.py --include-path DIR --model M --tasks T ...
"""
import sys

import lm_eval
from lm_eval.tasks import TaskManager


def main():
    argv = sys.argv[1:]
    include = None
    if "--include-path" in argv:
        i = argv.index("--include-path")
        include = argv[i + 1]
        del argv[i : i + 2]
    sys.argv = ["mlx_lm.evaluate"] + argv
    if include is not None:
        original = lm_eval.simple_evaluate

        def simple_evaluate(*args, **kwargs):
            kwargs.setdefault("task_manager", TaskManager(include_path=include))
            return original(*args, **kwargs)

        lm_eval.simple_evaluate = simple_evaluate
    from mlx_lm import evaluate

    evaluate.main()


if __name__ == "__main__":
    main()

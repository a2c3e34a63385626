"""mlx-lm's side of benchmarks/gpu_lora.sh: `mlx_lm lora` with its own arguments, its
training reports (`on_train_loss_report`: tokens/s, peak memory, ...) appended as JSON
lines to METRICS, the file our `mlx-lora` writes as <adapter-path>/metrics.jsonl.

  python benchmarks/lora_mlx_lm.py METRICS [mlx_lm lora arguments...]
"""

import json
import sys

import mlx_lm.lora as lora
from mlx_lm.tuner.callbacks import TrainingCallback


class Recorder(TrainingCallback):
    def __init__(self, path):
        self.path = path
        open(path, "w").close()

    def _write(self, info):
        with open(self.path, "a") as f:
            f.write(json.dumps(info) + "\n")

    def on_train_loss_report(self, train_info):
        self._write(train_info)

    def on_val_loss_report(self, val_info):
        self._write(val_info)


def main():
    metrics = sys.argv[1]
    sys.argv = ["mlx_lm.lora"] + sys.argv[2:]
    # mlx-lm's `run` replaces any callback it is given with get_reporting_callbacks()'s
    # (None without --report-to), so the recorder goes in there.
    recorder = Recorder(metrics)
    lora.get_reporting_callbacks = lambda *args, **kwargs: recorder
    lora.main()


if __name__ == "__main__":
    main()

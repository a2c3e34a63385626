"""mlx-lm 0.32.2's `olmo.py` made runnable as the parity oracle (imported for its side
effects by make_tiny_models.py, oracle_logits.py and convert_oracle.py; gen_oracle.py
gets it through make_tiny_models).

Three things stop the file from running as it is, none of them its arithmetic:
- it imports `hf_olmo` (the `ai2-olmo` package) only to see that it exists, and exits
  the process without it: an empty module of that name stands in;
- `scores += mask` cannot add the "causal" string that `create_attention_mask` gives
  for any input of more than one token (ValueError: cannot add a str in place): the module's
  `create_attention_mask` returns the array mask instead, as the additive mask the file
  was written against (0 where a key is visible, the dtype's most negative value
  elsewhere, in the activations' dtype so the scores keep theirs);
- with `weight_tying` the model returns `(logits, cache)`: the logits are taken out.

The Rust port (crates/mlx-models/src/models/olmo.rs) does the same; docs/parity.md
lists the differences from mlx-lm.
"""

import sys
import types

import mlx.core as mx

sys.modules.setdefault("hf_olmo", types.ModuleType("hf_olmo"))

from mlx_lm.models import base, olmo  # noqa: E402


def additive_attention_mask(h, cache=None):
    mask = base.create_attention_mask(h, cache, return_array=True)
    if mask is None or mask.dtype != mx.bool_:
        return mask
    low = mx.array(mx.finfo(h.dtype).min, dtype=h.dtype)
    return mx.where(mask, mx.array(0, dtype=h.dtype), low)


def logits_only(call):
    def forward(self, inputs, cache=None):
        out = call(self, inputs, cache)
        return out[0] if isinstance(out, tuple) else out

    forward.__wrapped__ = call
    return forward


if not hasattr(olmo.Model.__call__, "__wrapped__"):
    olmo.create_attention_mask = additive_attention_mask
    olmo.Model.__call__ = logits_only(olmo.Model.__call__)

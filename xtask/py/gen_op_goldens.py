"""Bit-exact op goldens for mlx-array, computed with Python MLX 0.32.4.

Usage: gen_op_goldens.py OUT_DIR   (normally through `cargo xtask goldens`)

Writes OUT_DIR/<family>.safetensors (inputs under `in/<name>`, outputs under
`out/<case>/<i>`) and OUT_DIR/manifest.json: one entry per case with the op name,
its parameters, the input keys and the number of outputs. The Rust test
`crates/mlx-array/tests/op_goldens.rs` replays every case through mlx-array and
compares dtype, shape and bytes. Inputs come from a seeded numpy generator.
"""

import json
import math
import os
import sys

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models import activations as lm_act

RNG = np.random.default_rng(20240917)
DT = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}
DNAME = {
    mx.float32: "float32",
    mx.float16: "float16",
    mx.bfloat16: "bfloat16",
    mx.int32: "int32",
    mx.int64: "int64",
    mx.uint8: "uint8",
    mx.uint32: "uint32",
    mx.int8: "int8",
    mx.int16: "int16",
    mx.uint16: "uint16",
    mx.bool_: "bool",
}


class Family:
    def __init__(self, name):
        self.name = name
        self.tensors = {}

    def inp(self, name, arr):
        key = f"in/{name}"
        assert key not in self.tensors, key
        self.tensors[key] = arr
        return key


FAMILIES = {}
CASES = []
FAM = None


def family(name):
    global FAM
    FAM = Family(name)
    FAMILIES[name] = FAM


def randn(shape, dt="f32", scale=1.0):
    return mx.array((RNG.standard_normal(shape) * scale).astype(np.float32)).astype(DT[dt])


def randint(lo, hi, shape, dtype=mx.int32):
    return mx.array(RNG.integers(lo, hi, size=shape)).astype(dtype)


def I(name, arr):
    """Registers an input tensor of the current family and returns its key."""
    return FAM.inp(name, arr)


def case(name, op, params, inputs, fn):
    """Runs `fn` on the input arrays and records the case."""
    arrs = [FAM.tensors[k] for k in inputs]
    outs = fn(*arrs)
    if isinstance(outs, mx.array):
        outs = [outs]
    outs = list(outs)
    mx.eval(outs)
    for i, o in enumerate(outs):
        FAM.tensors[f"out/{name}/{i}"] = o
    assert all(c["name"] != name for c in CASES), name
    CASES.append(
        {
            "name": name,
            "file": FAM.name,
            "op": op,
            "params": params,
            "inputs": inputs,
            "outputs": len(outs),
        }
    )


# --------------------------------------------------------------------- elementwise
def gen_elementwise():
    family("elementwise")
    for dt in ("f32", "f16", "bf16"):
        a = I(f"a_{dt}", randn((2, 3, 4), dt))
        b = I(f"b_{dt}", randn((3, 1), dt))
        pos = I(f"pos_{dt}", mx.abs(randn((3, 4), dt)) + 0.1)
        unit = I(f"unit_{dt}", mx.array(RNG.uniform(-0.9, 0.9, (3, 4)).astype(np.float32)).astype(DT[dt]))
        for fn in ("add", "subtract", "multiply", "divide", "maximum", "minimum", "power",
                   "floor_divide", "remainder", "arctan2", "logaddexp", "equal", "not_equal",
                   "greater", "greater_equal", "less", "less_equal"):
            x, y = (pos, pos) if fn == "power" else (a, b)
            case(f"{fn}_{dt}", "binary", {"fn": fn}, [x, y], getattr(mx, fn))
        for fn in ("abs", "negative", "sign", "floor", "ceil", "square", "exp", "expm1",
                   "sin", "cos", "tan", "arctan", "sinh", "cosh", "tanh", "arcsinh",
                   "sigmoid", "erf", "round", "degrees", "radians", "isnan", "isinf",
                   "isfinite", "stop_gradient", "trunc" if hasattr(mx, "trunc") else "abs"):
            case(f"{fn}_{dt}", "unary", {"fn": fn}, [a], getattr(mx, fn))
        for fn in ("sqrt", "rsqrt", "reciprocal", "log", "log1p", "log2", "log10", "arccosh"):
            x = pos
            if fn == "arccosh":
                case(f"{fn}_{dt}", "unary", {"fn": fn}, [pos], lambda v: mx.arccosh(v + 1))
                CASES[-1]["params"]["pre_add"] = 1
                continue
            case(f"{fn}_{dt}", "unary", {"fn": fn}, [x], getattr(mx, fn))
        for fn in ("arcsin", "arccos", "arctanh", "erfinv"):
            case(f"{fn}_{dt}", "unary", {"fn": fn}, [unit], getattr(mx, fn))
        # Python scalars: a float scalar keeps the array's float dtype.
        for fn, sym in (("multiply", lambda x: x * 0.5), ("add", lambda x: x + 2),
                        ("subtract", lambda x: x - 1.25), ("divide", lambda x: x / 3.0),
                        ("power", lambda x: x**2), ("maximum", lambda x: mx.maximum(x, 0.0))):
            s = {"multiply": 0.5, "add": 2, "subtract": 1.25, "divide": 3.0, "power": 2,
                 "maximum": 0.0}[fn]
            case(f"{fn}_scalar_{dt}", "binary_scalar",
                 {"fn": fn, "scalar": s, "int": isinstance(s, int), "left": False}, [a], sym)
        case(f"rsub_scalar_{dt}", "binary_scalar",
             {"fn": "subtract", "scalar": 1.0, "int": False, "left": True}, [a], lambda x: 1.0 - x)
        case(f"rdiv_scalar_{dt}", "binary_scalar",
             {"fn": "divide", "scalar": 1, "int": True, "left": True}, [pos], lambda x: 1 / x)
        case(f"where_{dt}", "where", {}, [I(f"cond_{dt}", randn((3, 4)) > 0), a, b], mx.where)
        case(f"clip_{dt}", "clip", {"min": -0.5, "max": 0.75}, [a],
             lambda x: mx.clip(x, -0.5, 0.75))
        case(f"round2_{dt}", "round", {"decimals": 2}, [a], lambda x: mx.round(x, 2))
    # promotion between float types and with ints
    a16 = "in/a_f16"
    abf = "in/a_bf16"
    a32 = "in/a_f32"
    i32 = I("i32", randint(-20, 20, (2, 3, 4)))
    i32b = I("i32b", randint(1, 7, (3, 4)))
    u8 = I("u8", randint(0, 255, (3, 4), mx.uint8))
    u8b = I("u8b", randint(0, 255, (3, 4), mx.uint8))
    i8 = I("i8", randint(-100, 100, (3, 4), mx.int8))
    bl = I("bool_a", randn((3, 4)) > 0)
    bl2 = I("bool_b", randn((3, 4)) > 0)
    case("add_f16_bf16", "binary", {"fn": "add"}, [a16, abf], mx.add)
    case("multiply_bf16_f32", "binary", {"fn": "multiply"}, [abf, a32], mx.multiply)
    case("add_i32_f16", "binary", {"fn": "add"}, [i32, a16], mx.add)
    case("add_u8_i8", "binary", {"fn": "add"}, [u8, i8], mx.add)
    for fn in ("add", "subtract", "multiply", "floor_divide", "remainder", "maximum", "minimum",
               "equal", "less"):
        case(f"{fn}_i32", "binary", {"fn": fn}, [i32, i32b], getattr(mx, fn))
    case("divide_i32", "binary", {"fn": "divide"}, [i32, i32b], mx.divide)
    for fn in ("bitwise_and", "bitwise_or", "bitwise_xor"):
        case(f"{fn}_u8", "binary", {"fn": fn}, [u8, u8b], getattr(mx, fn))
        case(f"{fn}_i32", "binary", {"fn": fn}, [i32, i32b], getattr(mx, fn))
    case("left_shift_i32", "binary", {"fn": "left_shift"}, [i32, i32b], mx.left_shift)
    case("right_shift_u8", "binary", {"fn": "right_shift"},
         [u8, I("u8_small", randint(0, 8, (3, 4), mx.uint8))], mx.right_shift)
    case("bitwise_invert_u8", "unary", {"fn": "bitwise_invert"}, [u8], mx.bitwise_invert)
    case("abs_i32", "unary", {"fn": "abs"}, [i32], mx.abs)
    case("negative_i32", "unary", {"fn": "negative"}, [i32], mx.negative)
    case("logical_and", "binary", {"fn": "logical_and"}, [bl, bl2], mx.logical_and)
    case("logical_or", "binary", {"fn": "logical_or"}, [bl, bl2], mx.logical_or)
    case("logical_not", "unary", {"fn": "logical_not"}, [bl], mx.logical_not)
    case("add_bool_bool", "binary", {"fn": "add"}, [bl, bl2], mx.add)
    # integer and bool arrays with Python scalars
    case("multiply_scalar_i32_float", "binary_scalar",
         {"fn": "multiply", "scalar": 0.5, "int": False, "left": False}, [i32], lambda x: x * 0.5)
    case("add_scalar_i32_int", "binary_scalar",
         {"fn": "add", "scalar": 3, "int": True, "left": False}, [i32], lambda x: x + 3)
    case("add_scalar_u8_int", "binary_scalar",
         {"fn": "add", "scalar": 250, "int": True, "left": False}, [u8], lambda x: x + 250)
    case("multiply_scalar_i8_float", "binary_scalar",
         {"fn": "multiply", "scalar": 2.5, "int": False, "left": False}, [i8], lambda x: x * 2.5)
    case("add_scalar_bool_int", "binary_scalar",
         {"fn": "add", "scalar": 1, "int": True, "left": False}, [bl], lambda x: x + 1)
    case("add_scalar_bool_float", "binary_scalar",
         {"fn": "add", "scalar": 1.5, "int": False, "left": False}, [bl], lambda x: x + 1.5)
    case("multiply_scalar_f16_overflow", "binary_scalar",
         {"fn": "multiply", "scalar": 70000.0, "int": False, "left": False}, [a16],
         lambda x: x * 70000.0)
    # matmul and addmm
    for dt in ("f32", "f16", "bf16"):
        x = I(f"mm_x_{dt}", randn((2, 3, 16), dt))
        w = I(f"mm_w_{dt}", randn((16, 8), dt))
        case(f"matmul_{dt}", "matmul", {}, [x, w], mx.matmul)
        bx = I(f"mm_bx_{dt}", randn((2, 1, 4, 16), dt))
        bw = I(f"mm_bw_{dt}", randn((3, 16, 5), dt))
        case(f"matmul_batched_bcast_{dt}", "matmul", {}, [bx, bw], mx.matmul)
        c = I(f"mm_c_{dt}", randn((8,), dt))
        m = I(f"mm_m_{dt}", randn((5, 16), dt))
        case(f"addmm_{dt}", "addmm", {"alpha": 0.5, "beta": 2.0}, [c, m, w],
             lambda c, a, b: mx.addmm(c, a, b, alpha=0.5, beta=2.0))
    v = I("mm_vec", randn((16,)))
    case("matmul_vec_mat", "matmul", {}, [v, "in/mm_w_f32"], mx.matmul)
    case("matmul_mat_vec", "matmul", {}, ["in/mm_m_f32", v], mx.matmul)
    # astype / view
    wide = I("wide_f32", randn((4, 8), scale=300.0))
    for dt in ("float16", "bfloat16", "int32", "uint8", "int8", "bool"):
        d = getattr(mx, dt if dt != "bool" else "bool_")
        case(f"astype_f32_{dt}", "astype", {"dtype": dt}, [wide], lambda x, d=d: x.astype(d))
    case("astype_bf16_f32", "astype", {"dtype": "float32"}, [abf], lambda x: x.astype(mx.float32))
    case("astype_bf16_f16", "astype", {"dtype": "float16"}, [abf], lambda x: x.astype(mx.float16))
    case("astype_i32_f32", "astype", {"dtype": "float32"}, [i32], lambda x: x.astype(mx.float32))
    case("astype_i32_bf16", "astype", {"dtype": "bfloat16"}, [i32], lambda x: x.astype(mx.bfloat16))
    case("view_f32_i32", "view", {"dtype": "int32"}, [a32], lambda x: x.view(mx.int32))
    case("view_bf16_u16", "view", {"dtype": "uint16"}, [abf], lambda x: x.view(mx.uint16))
    case("view_f32_u8", "view", {"dtype": "uint8"}, [a32], lambda x: x.view(mx.uint8))
    case("view_u8_f16", "view", {"dtype": "float16"}, [u8], lambda x: x.view(mx.float16))


# ------------------------------------------------------------- reductions, sorting
def gen_reduce():
    family("reduce")
    for dt in ("f32", "f16", "bf16"):
        x = I(f"x_{dt}", randn((3, 4, 5), dt))
        for fn in ("sum", "mean", "max", "min", "prod", "logsumexp"):
            for axes, kd in ((None, False), ([1], False), ([0, 2], True), ([-1], True)):
                tag = "all" if axes is None else "_".join(str(a) for a in axes)
                case(f"{fn}_{tag}_{'kd' if kd else 'nokd'}_{dt}", "reduce",
                     {"fn": fn, "axes": axes, "keepdims": kd}, [x],
                     lambda v, fn=fn, axes=axes, kd=kd: getattr(mx, fn)(v, axis=axes, keepdims=kd))
        for fn in ("var", "std"):
            for axes, kd, ddof in ((None, False, 0), ([1], True, 1), ([0, 2], False, 0)):
                tag = "all" if axes is None else "_".join(str(a) for a in axes)
                case(f"{fn}_{tag}_{ddof}_{dt}", fn, {"axes": axes, "keepdims": kd, "ddof": ddof},
                     [x], lambda v, fn=fn, axes=axes, kd=kd, ddof=ddof:
                     getattr(mx, fn)(v, axis=axes, keepdims=kd, ddof=ddof))
        for precise in (False, True):
            case(f"softmax_last_{'p' if precise else 'np'}_{dt}", "softmax",
                 {"axes": [-1], "precise": precise}, [x],
                 lambda v, p=precise: mx.softmax(v, axis=-1, precise=p))
        case(f"softmax_axes01_{dt}", "softmax", {"axes": [0, 1], "precise": False}, [x],
             lambda v: mx.softmax(v, axis=[0, 1]))
        for fn in ("argmax", "argmin"):
            case(f"{fn}_ax1_{dt}", fn, {"axis": 1, "keepdims": False}, [x],
                 lambda v, fn=fn: getattr(mx, fn)(v, axis=1))
            case(f"{fn}_flat_kd_{dt}", fn, {"axis": None, "keepdims": True}, [x],
                 lambda v, fn=fn: getattr(mx, fn)(v, keepdims=True))
        case(f"sort_last_{dt}", "sort", {"axis": -1}, [x], lambda v: mx.sort(v, axis=-1))
        case(f"sort_flat_{dt}", "sort", {"axis": None}, [x], lambda v: mx.sort(v, axis=None))
        case(f"argsort_ax0_{dt}", "argsort", {"axis": 0}, [x], lambda v: mx.argsort(v, axis=0))
        case(f"partition_{dt}", "partition", {"kth": 2, "axis": -1}, [x],
             lambda v: mx.partition(v, 2, axis=-1))
        case(f"argpartition_{dt}", "argpartition", {"kth": 1, "axis": -1}, [x],
             lambda v: mx.argpartition(v, 1, axis=-1))
        case(f"argpartition_neg_{dt}", "argpartition", {"kth": -2, "axis": 1}, [x],
             lambda v: mx.argpartition(v, -2, axis=1))
        case(f"topk_{dt}", "topk", {"k": 3, "axis": -1}, [x], lambda v: mx.topk(v, 3, axis=-1))
        case(f"topk_flat_{dt}", "topk", {"k": 4, "axis": None}, [x],
             lambda v: mx.topk(v, 4, axis=None))
        for fn in ("cumsum", "cumprod", "cummax", "cummin", "logcumsumexp"):
            for axis, rev, inc in ((-1, False, True), (1, True, True), (0, False, False)):
                case(f"{fn}_{axis}_{int(rev)}{int(inc)}_{dt}", "scan",
                     {"fn": fn, "axis": axis, "reverse": rev, "inclusive": inc}, [x],
                     lambda v, fn=fn, a=axis, r=rev, i=inc:
                     getattr(mx, fn)(v, axis=a, reverse=r, inclusive=i))
    xi = I("x_i32", randint(-50, 50, (3, 4, 5)))
    for fn in ("sum", "prod", "max", "min"):
        case(f"{fn}_ax1_i32", "reduce", {"fn": fn, "axes": [1], "keepdims": False}, [xi],
             lambda v, fn=fn: getattr(mx, fn)(v, axis=1))
    case("mean_i32", "reduce", {"fn": "mean", "axes": None, "keepdims": False}, [xi], mx.mean)
    case("cumsum_i32", "scan", {"fn": "cumsum", "axis": -1, "reverse": False, "inclusive": True},
         [xi], lambda v: mx.cumsum(v, axis=-1))
    case("argsort_i32_ties", "argsort", {"axis": -1},
         [I("ties_i32", randint(0, 3, (4, 9)))], lambda v: mx.argsort(v, axis=-1))
    xb = I("x_bool", randn((3, 4)) > 0.3)
    for fn in ("all", "any"):
        case(f"{fn}_ax1_bool", "reduce", {"fn": fn, "axes": [1], "keepdims": False}, [xb],
             lambda v, fn=fn: getattr(mx, fn)(v, axis=1))
        case(f"{fn}_all_bool", "reduce", {"fn": fn, "axes": None, "keepdims": False}, [xb],
             lambda v, fn=fn: getattr(mx, fn)(v))
    case("sum_bool", "reduce", {"fn": "sum", "axes": [-1], "keepdims": False}, [xb],
         lambda v: mx.sum(v, axis=-1))
    big = I("big_f32", randn((2, 1000), scale=3.0))
    case("sum_big_f32", "reduce", {"fn": "sum", "axes": [-1], "keepdims": False}, [big],
         lambda v: mx.sum(v, axis=-1))
    case("logsumexp_big_f32", "reduce", {"fn": "logsumexp", "axes": [-1], "keepdims": True},
         [big], lambda v: mx.logsumexp(v, axis=-1, keepdims=True))
    bigb = I("big_bf16", randn((2, 1000), "bf16", scale=3.0))
    case("softmax_big_precise_bf16", "softmax", {"axes": [-1], "precise": True}, [bigb],
         lambda v: mx.softmax(v, axis=-1, precise=True))
    case("argpartition_big_bf16", "argpartition", {"kth": -20, "axis": -1}, [bigb],
         lambda v: mx.argpartition(v, -20, axis=-1))


# ----------------------------------------------------------------- shapes, indexing
def gen_shape_index():
    family("shape_index")
    x = I("x", randn((2, 3, 4)))
    xb = I("x_bf16", randn((2, 3, 4), "bf16"))
    case("reshape", "reshape", {"shape": [4, -1]}, [x], lambda v: v.reshape(4, -1))
    case("transpose_rev", "transpose", {"axes": None}, [x], lambda v: mx.transpose(v))
    case("transpose_perm", "transpose", {"axes": [1, 2, 0]}, [x], lambda v: v.transpose(1, 2, 0))
    case("swapaxes", "swapaxes", {"a1": 0, "a2": -1}, [x], lambda v: mx.swapaxes(v, 0, -1))
    case("moveaxis", "moveaxis", {"src": 0, "dst": 2}, [x], lambda v: mx.moveaxis(v, 0, 2))
    case("expand_dims", "expand_dims", {"axes": [0, 3]}, [x], lambda v: mx.expand_dims(v, (0, 3)))
    sq = I("sq", randn((1, 3, 1, 2)))
    case("squeeze_all", "squeeze", {"axes": None}, [sq], lambda v: mx.squeeze(v))
    case("squeeze_ax", "squeeze", {"axes": [2]}, [sq], lambda v: mx.squeeze(v, 2))
    case("flatten", "flatten", {"start": 1, "end": 2}, [x], lambda v: mx.flatten(v, 1, 2))
    case("unflatten", "unflatten", {"axis": 2, "shape": [2, 2]}, [x],
         lambda v: mx.unflatten(v, 2, (2, 2)))
    y = I("y", randn((2, 5, 4)))
    case("concatenate", "concatenate", {"axis": 1}, [x, y], lambda a, b: mx.concatenate([a, b], 1))
    case("concatenate_mixed", "concatenate", {"axis": 1}, [xb, y],
         lambda a, b: mx.concatenate([a, b], 1))
    case("stack", "stack", {"axis": 1}, [x, x], lambda a, b: mx.stack([a, b], axis=1))
    case("split_sections", "split_sections", {"n": 2, "axis": 2}, [x],
         lambda v: mx.split(v, 2, axis=2))
    case("split_at", "split_at", {"indices": [1, 3], "axis": -1}, [x],
         lambda v: mx.split(v, [1, 3], axis=-1))
    case("pad_const", "pad", {"axes": [1, 2], "low": [1, 0], "high": [2, 3], "value": None,
                              "mode": "constant"}, [x],
         lambda v: mx.pad(v, [(0, 0), (1, 2), (0, 3)]))
    case("pad_value_bf16", "pad", {"axes": [0, 1, 2], "low": [0, 1, 1], "high": [0, 0, 2],
                                   "value": 1.5, "mode": "constant"}, [xb],
         lambda v: mx.pad(v, [(0, 0), (1, 0), (1, 2)], constant_values=1.5))
    case("pad_edge", "pad", {"axes": [0, 1, 2], "low": [0, 2, 1], "high": [0, 1, 1],
                             "value": None, "mode": "edge"}, [x],
         lambda v: mx.pad(v, [(0, 0), (2, 1), (1, 1)], mode="edge"))
    for mode in ("reflect", "symmetric"):
        case(f"pad_{mode}", "pad", {"axes": [1, 2], "low": [2, 1], "high": [1, 3], "value": None,
                                    "mode": mode}, [x],
             lambda v, m=mode: mx.pad(v, [(0, 0), (2, 1), (1, 3)], mode=m))
    case("repeat_ax", "repeat", {"repeats": 2, "axis": 1}, [x], lambda v: mx.repeat(v, 2, axis=1))
    case("repeat_flat", "repeat", {"repeats": 3, "axis": None}, [x], lambda v: mx.repeat(v, 3))
    case("tile", "tile", {"reps": [2, 1, 3]}, [x], lambda v: mx.tile(v, [2, 1, 3]))
    case("broadcast_to", "broadcast_to", {"shape": [3, 2, 3, 4]}, [x],
         lambda v: mx.broadcast_to(v, (3, 2, 3, 4)))
    case("flip", "flip", {"axes": [1]}, [x], lambda v: v[:, ::-1])
    case("roll", "roll", {"shift": 2, "axis": 2}, [x], lambda v: mx.roll(v, 2, axis=2))
    case("roll_flat", "roll", {"shift": -3, "axis": None}, [x], lambda v: mx.roll(v, -3))
    # slicing
    big = I("big", randn((4, 6, 5)))
    case("slice_basic", "slice", {"start": [1, 0, 2], "stop": [3, 6, 5], "strides": [1, 2, 1]},
         [big], lambda v: v[1:3, ::2, 2:])
    case("slice_neg_stride", "slice", {"start": [3, 5, 0], "stop": [-5, -7, 5],
                                       "strides": [-1, -2, 1]},
         [big], lambda v: v[::-1, ::-2])
    upd = I("upd", randn((2, 3, 5)))
    case("slice_update", "slice_update", {"start": [1, 0, 0], "stop": [3, 6, 5],
                                          "strides": [1, 2, 1]},
         [big, upd], lambda v, u: _setitem(v, (slice(1, 3), slice(None, None, 2)), u))
    upd_bf = I("upd_bf16", randn((2, 3, 5), "bf16"))
    case("slice_update_cast", "slice_update", {"start": [1, 0, 0], "stop": [3, 6, 5],
                                               "strides": [1, 2, 1]},
         [big, upd_bf], lambda v, u: _setitem(v, (slice(1, 3), slice(None, None, 2)), u))
    start = I("start", mx.array([2, 1], mx.int32))
    case("slice_dynamic", "slice_dynamic", {"axes": [0, 1], "size": [2, 3, 5]}, [big, start],
         lambda v, s: mx.slice(v, s, (0, 1), (2, 3, 5)))
    upd2 = I("upd2", randn((1, 2, 5)))
    case("slice_update_dynamic", "slice_update_dynamic", {"axes": [0, 1]}, [big, upd2, start],
         lambda v, u, s: mx.slice_update(v, u, s, (0, 1)))
    idx = I("idx", mx.array([[3, 0], [1, 1], [2, 0]], mx.int32))
    case("take_ax1", "take", {"axis": 1}, [big, idx], lambda v, i: mx.take(v, i, axis=1))
    case("take_flat", "take", {"axis": None}, [big, idx], lambda v, i: mx.take(v, i))
    case("take_neg_idx", "take", {"axis": 0},
         [big, I("neg_idx", mx.array([-1, 0, -3], mx.int32))], lambda v, i: mx.take(v, i, axis=0))
    tidx = I("tidx", randint(0, 6, (4, 2, 5)))
    case("take_along_axis", "take_along_axis", {"axis": 1}, [big, tidx],
         lambda v, i: mx.take_along_axis(v, i, axis=1))
    vals = I("vals", randn((4, 2, 5)))
    pidx = I("pidx", mx.array(np.stack([RNG.permutation(6)[:2] for _ in range(20)]).reshape(4, 5, 2)
                              .transpose(0, 2, 1).astype(np.int32)))
    case("put_along_axis", "put_along_axis", {"axis": 1}, [big, pidx, vals],
         lambda v, i, u: mx.put_along_axis(v, i, u, axis=1))
    logits = I("logits", randn((2, 10), "bf16"))
    kidx = I("kidx", mx.array([[1, 4, 7], [0, 9, 2]], mx.int32))
    case("put_along_axis_sampler", "put_along_axis", {"axis": -1},
         [logits, kidx, I("ninf", mx.array([[-float("inf")] * 3] * 2, mx.bfloat16))],
         lambda v, i, u: mx.put_along_axis(v, i, u, axis=-1))
    # scatter (through indexing, like Python code does)
    sidx = I("sidx", mx.array([4, 0, 2, 0], mx.int32))
    supd = I("supd", randn((4, 3)))
    base = I("base", randn((6, 3)))
    case("scatter_set", "scatter", {"kind": "set", "axes": [0], "updates_shape": [4, 1, 3]},
         [base, sidx, supd], lambda b, i, u: _setitem(b, i, u))
    for kind in ("add", "prod", "max", "min"):
        case(f"scatter_{kind}", "scatter",
             {"kind": kind, "axes": [0], "updates_shape": [4, 1, 3]}, [base, sidx, supd],
             lambda b, i, u, k=kind: getattr(b.at[i], {"add": "add", "prod": "multiply",
                                                      "max": "maximum", "min": "minimum"}[k])(u))
    gi0 = I("gi0", mx.array([0, 3, 1], mx.int32))
    gi1 = I("gi1", mx.array([5, 2, 2], mx.int32))
    case("gather_2idx", "gather", {"axes": [0, 1], "slice_sizes": [1, 1, 5], "out_shape": [3, 5]},
         [big, gi0, gi1], lambda v, a, b: v[a, b])
    mask = I("mask", randn((6, 3)) > 0)
    nmask = int(np.array(FAM.tensors["in/mask"]).sum())
    src = I("msrc", randn((nmask,)))
    case("masked_scatter", "masked_scatter", {}, [base, mask, src],
         lambda b, m, s: mx.masked_scatter(b, m, s) if hasattr(mx, "masked_scatter")
         else _setitem(b, m, s))
    case("where_scalar_like", "where", {}, [mask, base, I("zero_f32", mx.array(0.0))], mx.where)
    # construction
    sq4 = I("sq4", randn((4, 5), "bf16"))
    for k in (0, 1, -1):
        case(f"tril_{k}", "tril", {"k": k}, [sq4], lambda v, k=k: mx.tril(v, k))
        case(f"triu_{k}", "triu", {"k": k}, [sq4], lambda v, k=k: mx.triu(v, k))
    case("arange_int", "arange", {"start": 0, "stop": 7, "step": 1, "dtype": "int32"}, [],
         lambda: mx.arange(7))
    case("arange_float", "arange", {"start": 0.5, "stop": 3.0, "step": 0.3, "dtype": "float32"},
         [], lambda: mx.arange(0.5, 3.0, 0.3))
    case("arange_bf16", "arange", {"start": 0, "stop": 10, "step": 1.5, "dtype": "bfloat16"}, [],
         lambda: mx.arange(0, 10, 1.5, dtype=mx.bfloat16))
    case("zeros_bf16", "zeros", {"shape": [2, 3], "dtype": "bfloat16"}, [],
         lambda: mx.zeros((2, 3), mx.bfloat16))
    case("ones_i32", "ones", {"shape": [4], "dtype": "int32"}, [], lambda: mx.ones((4,), mx.int32))
    # Python's full(shape, <array>, dtype) ignores dtype (see docs/parity.md), so the
    # goldens use a Python scalar, as mlx-lm does.
    case("full_f16", "full", {"shape": [2, 2], "dtype": "float16", "value": 3.14159}, [],
         lambda: mx.full((2, 2), 3.14159, mx.float16))
    case("full_arr_f32", "full", {"shape": [2, 3], "dtype": "float32"},
         [I("fill", mx.array([1.5, -2.0, 0.25]))], lambda v: mx.full((2, 3), v))
    case("eye", "eye", {"n": 3, "m": 4, "k": 1, "dtype": "float32"}, [],
         lambda: mx.eye(3, 4, 1))
    case("tri", "tri", {"n": 3, "m": 3, "k": 0, "dtype": "bool"}, [],
         lambda: mx.tri(3, 3, 0, mx.bool_))
    case("linspace", "linspace", {"start": -1.0, "stop": 2.0, "num": 7, "dtype": "float32"}, [],
         lambda: mx.linspace(-1.0, 2.0, 7))
    case("linspace_bf16", "linspace", {"start": 0.0, "stop": 1.0, "num": 5, "dtype": "bfloat16"},
         [], lambda: mx.linspace(0.0, 1.0, 5, dtype=mx.bfloat16))


def _setitem(v, idx, u):
    v = mx.array(v)
    v[idx] = u
    return v


# ------------------------------------------------------------ activations and fast
ACTS = {
    # name: (mlx.nn compiled function, plain formula, number of inputs)
    "silu": (nn.silu, lambda x: x * mx.sigmoid(x), 1),
    "relu": (nn.relu, lambda x: mx.maximum(x, 0), 1),
    "relu2": (nn.relu2, lambda x: mx.square(mx.maximum(x, 0)), 1),
    "relu6": (nn.relu6, lambda x: mx.minimum(mx.maximum(x, 0), 6.0), 1),
    "leaky_relu": (nn.leaky_relu, lambda x: mx.maximum(0.01 * x, x), 1),
    "elu": (nn.elu, lambda x: mx.where(x > 0, x, 1.0 * (mx.exp(x) - 1)), 1),
    "gelu": (nn.gelu, lambda x: x * (1 + mx.erf(x / math.sqrt(2))) / 2, 1),
    "gelu_approx": (nn.gelu_approx, lambda x: 0.5 * x * (
        1 + mx.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))), 1),
    "gelu_fast_approx": (nn.gelu_fast_approx, lambda x: x * mx.sigmoid(1.702 * x), 1),
    "softplus": (nn.softplus, lambda x: mx.logaddexp(x, 0), 1),
    "softsign": (nn.softsign, lambda x: mx.divide(x, 1 + mx.abs(x)), 1),
    "log_sigmoid": (nn.log_sigmoid, lambda x: -mx.logaddexp(-x, 0), 1),
    "mish": (nn.mish, lambda x: x * mx.tanh(mx.logaddexp(x, 0)), 1),
    "hardswish": (nn.hardswish, lambda x: x * mx.minimum(mx.maximum(x + 3, 0), 6) / 6, 1),
    "sigmoid": (nn.sigmoid, mx.sigmoid, 1),
    "tanh": (nn.tanh, mx.tanh, 1),
    "log_softmax": (nn.log_softmax, lambda x: _log_softmax_plain(x), 1),
    "swiglu": (lm_act.swiglu, lambda g, x: (g * mx.sigmoid(g)) * x, 2),
    "swiglu_oai": (lm_act.swiglu_oai, lambda g, x: (mx.clip(x, -7.0, 7.0) + 1.0)
                   * (mx.minimum(g, 7.0) * mx.sigmoid(1.702 * mx.minimum(g, 7.0))), 2),
}


def _log_softmax_plain(x):
    x = x - mx.stop_gradient(mx.max(x, axis=-1, keepdims=True))
    return x - mx.logsumexp(x, axis=-1, keepdims=True)


def gen_nn():
    family("nn")
    for dt in ("f32", "f16", "bf16"):
        x = I(f"x_{dt}", randn((3, 37), dt, scale=3.0))
        g = I(f"g_{dt}", randn((3, 37), dt, scale=4.0))
        for name, (compiled, plain, n) in ACTS.items():
            ins = [g, x] if n == 2 else [x]
            arrs = [FAM.tensors[k] for k in ins]
            c = compiled(*arrs)
            p = plain(*arrs)
            mx.eval(c, p)
            same = c.dtype == p.dtype and bool(mx.array_equal(c, p))
            case(f"act_{name}_{dt}", "activation", {"fn": name, "compiled_equals_plain": same},
                 ins, lambda *a, c=c, p=p: [c, p])
        # fast norms
        w = I(f"w_{dt}", randn((37,), dt))
        b = I(f"bias_{dt}", randn((37,), dt))
        case(f"rms_norm_{dt}", "rms_norm", {"eps": 1e-5}, [x, w],
             lambda v, w: mx.fast.rms_norm(v, w, 1e-5))
        case(f"rms_norm_noweight_{dt}", "rms_norm", {"eps": 1e-6}, [x],
             lambda v: mx.fast.rms_norm(v, None, 1e-6))
        case(f"layer_norm_{dt}", "layer_norm", {"eps": 1e-5}, [x, w, b],
             lambda v, w, b: mx.fast.layer_norm(v, w, b, 1e-5))
        case(f"layer_norm_plain_{dt}", "layer_norm", {"eps": 1e-5}, [x],
             lambda v: mx.fast.layer_norm(v, None, None, 1e-5))
        # rope: (B, H, T, D)
        q = I(f"q_{dt}", randn((2, 4, 5, 16), dt))
        for trad in (False, True):
            t = int(trad)
            case(f"rope_off0_t{t}_{dt}", "rope", {"dims": 16, "traditional": trad, "base": 10000.0,
                                                   "scale": 1.0, "offset": 0}, [q],
                 lambda v, tr=trad: mx.fast.rope(v, 16, traditional=tr, base=10000.0, scale=1.0,
                                                 offset=0))
            case(f"rope_off7_partial_t{t}_{dt}", "rope",
                 {"dims": 8, "traditional": trad, "base": 500000.0, "scale": 0.5, "offset": 7},
                 [q], lambda v, tr=trad: mx.fast.rope(v, 8, traditional=tr, base=500000.0,
                                                      scale=0.5, offset=7))
        off = I(f"rope_off_{dt}", mx.array(11, mx.int32))
        case(f"rope_offarr_{dt}", "rope", {"dims": 16, "traditional": False, "base": 10000.0,
                                           "scale": 1.0, "offset": "array"}, [q, off],
             lambda v, o: mx.fast.rope(v, 16, traditional=False, base=10000.0, scale=1.0,
                                       offset=o))
        boff = I(f"rope_boff_{dt}", mx.array([3, 9], mx.int32))
        case(f"rope_batchoff_{dt}", "rope", {"dims": 16, "traditional": False, "base": 10000.0,
                                             "scale": 1.0, "offset": "array"}, [q, boff],
             lambda v, o: mx.fast.rope(v, 16, traditional=False, base=10000.0, scale=1.0,
                                       offset=o))
        freqs = I(f"freqs_{dt}", mx.array(
            (10000.0 ** (np.arange(0, 16, 2) / 16) * RNG.uniform(1, 4, 8)).astype(np.float32)))
        case(f"rope_freqs_{dt}", "rope", {"dims": 16, "traditional": False, "base": None,
                                          "scale": 1.0, "offset": 3}, [q, freqs],
             lambda v, f: mx.fast.rope(v, 16, traditional=False, base=None, scale=1.0, offset=3,
                                       freqs=f))
        # sdpa
        D = 16
        scale = 1.0 / math.sqrt(D)
        k = I(f"k_{dt}", randn((2, 2, 9, D), dt))
        v = I(f"v_{dt}", randn((2, 2, 9, D), dt))
        qq = I(f"sq_{dt}", randn((2, 4, 5, D), dt))
        q1 = I(f"sq1_{dt}", randn((2, 4, 1, D), dt))
        kf = I(f"kf_{dt}", randn((2, 4, 9, D), dt))
        vf = I(f"vf_{dt}", randn((2, 4, 9, D), dt))
        bm = I(f"bmask_{dt}", mx.array(RNG.uniform(size=(2, 1, 5, 9)) > 0.3) | mx.eye(5, 9, 4,
                                                                                     mx.bool_))
        am = I(f"amask_{dt}", randn((1, 4, 5, 9), dt))
        sinks = I(f"sinks_{dt}", randn((4,), dt))
        sd = mx.fast.scaled_dot_product_attention
        for tag, qk in (("mha", (qq, kf, vf)), ("gqa", (qq, k, v)), ("decode", (q1, k, v))):
            case(f"sdpa_{tag}_none_{dt}", "sdpa", {"scale": scale, "mask": "none", "sinks": False},
                 list(qk), lambda a, b, c: sd(a, b, c, scale=scale))
            case(f"sdpa_{tag}_causal_{dt}", "sdpa",
                 {"scale": scale, "mask": "causal", "sinks": False}, list(qk),
                 lambda a, b, c: sd(a, b, c, scale=scale, mask="causal"))
        case(f"sdpa_gqa_bool_{dt}", "sdpa", {"scale": scale, "mask": "array", "sinks": False},
             [qq, k, v, bm], lambda a, b, c, m: sd(a, b, c, scale=scale, mask=m))
        case(f"sdpa_mha_additive_{dt}", "sdpa", {"scale": scale, "mask": "array", "sinks": False},
             [qq, kf, vf, am], lambda a, b, c, m: sd(a, b, c, scale=scale, mask=m))
        case(f"sdpa_gqa_causal_sinks_{dt}", "sdpa",
             {"scale": scale, "mask": "causal", "sinks": True}, [qq, k, v, sinks],
             lambda a, b, c, s: sd(a, b, c, scale=scale, mask="causal", sinks=s))
        case(f"sdpa_gqa_bool_sinks_{dt}", "sdpa",
             {"scale": scale, "mask": "array", "sinks": True}, [qq, k, v, bm, sinks],
             lambda a, b, c, m, s: sd(a, b, c, scale=scale, mask=m, sinks=s))


# ------------------------------------------------------------------- quantization
def gen_quant():
    family("quant")
    w = I("w", randn((16, 256), "f32", scale=0.05))
    wb = I("w_bf16", randn((16, 256), "bf16", scale=0.05))
    x = I("x", randn((3, 256), "f32"))
    xb = I("x_bf16", randn((3, 256), "bf16"))
    for bits in (2, 3, 4, 5, 6, 8):
        for gs in (32, 64, 128):
            tag = f"affine_b{bits}_g{gs}"
            qw, sc, bi = mx.quantize(FAM.tensors[w], group_size=gs, bits=bits, mode="affine")
            case(f"quantize_{tag}", "quantize", {"group_size": gs, "bits": bits, "mode": "affine"},
                 [w], lambda a, gs=gs, bits=bits: mx.quantize(a, gs, bits, mode="affine"))
            kq, ks, kb = I(f"{tag}_w", qw), I(f"{tag}_s", sc), I(f"{tag}_b", bi)
            case(f"dequantize_{tag}", "dequantize",
                 {"group_size": gs, "bits": bits, "mode": "affine", "dtype": None}, [kq, ks, kb],
                 lambda q, s, b, gs=gs, bits=bits: mx.dequantize(q, s, b, gs, bits, mode="affine"))
            case(f"qmm_{tag}", "quantized_matmul",
                 {"transpose": True, "group_size": gs, "bits": bits, "mode": "affine"},
                 [x, kq, ks, kb],
                 lambda x, q, s, b, gs=gs, bits=bits:
                 mx.quantized_matmul(x, q, s, b, transpose=True, group_size=gs, bits=bits,
                                     mode="affine"))
    # bf16 weights, default group size / bits, and the non-transposed product
    qw, sc, bi = mx.quantize(FAM.tensors[wb])
    case("quantize_affine_default_bf16", "quantize",
         {"group_size": None, "bits": None, "mode": "affine"}, [wb], lambda a: mx.quantize(a))
    kq, ks, kb = I("bf_w", qw), I("bf_s", sc), I("bf_b", bi)
    case("dequantize_affine_bf16_to_f32", "dequantize",
         {"group_size": 64, "bits": 4, "mode": "affine", "dtype": "float32"}, [kq, ks, kb],
         lambda q, s, b: mx.dequantize(q, s, b, 64, 4, dtype=mx.float32))
    case("qmm_affine_bf16", "quantized_matmul",
         {"transpose": True, "group_size": 64, "bits": 4, "mode": "affine"}, [xb, kq, ks, kb],
         lambda x, q, s, b: mx.quantized_matmul(x, q, s, b, transpose=True))
    wt = I("w_t", randn((256, 64), "f32", scale=0.05))
    q2, s2, b2 = mx.quantize(FAM.tensors[wt], 64, 4)
    k2 = [I("wt_w", q2), I("wt_s", s2), I("wt_b", b2)]
    case("qmm_affine_notranspose", "quantized_matmul",
         {"transpose": False, "group_size": 64, "bits": 4, "mode": "affine"},
         [I("x_nt", randn((3, 256))), *k2],
         lambda x, q, s, b: mx.quantized_matmul(x, q, s, b, transpose=False))
    for mode, gs, bits in (("mxfp4", 32, 4), ("nvfp4", 16, 4), ("mxfp8", 32, 8)):
        for src, xs, dtag in ((w, x, "f32"), (wb, xb, "bf16")):
            tag = f"{mode}_{dtag}"
            qw, sc = mx.quantize(FAM.tensors[src], mode=mode)
            case(f"quantize_{tag}", "quantize", {"group_size": None, "bits": None, "mode": mode},
                 [src], lambda a, m=mode: mx.quantize(a, mode=m))
            kq, ks = I(f"{tag}_w", qw), I(f"{tag}_s", sc)
            case(f"dequantize_{tag}", "dequantize",
                 {"group_size": gs, "bits": bits, "mode": mode, "dtype": DNAME[FAM.tensors[src].dtype]},
                 [kq, ks], lambda q, s, m=mode, d=FAM.tensors[src].dtype:
                 mx.dequantize(q, s, mode=m, dtype=d))
            case(f"qmm_{tag}", "quantized_matmul",
                 {"transpose": True, "group_size": gs, "bits": bits, "mode": mode},
                 [xs, kq, ks], lambda x, q, s, m=mode: mx.quantized_matmul(x, q, s, mode=m))
    # MoE: gather_qmm / gather_mm with 4 experts
    ew = I("experts", randn((4, 32, 128), "f32", scale=0.05))
    eq, es, eb = mx.quantize(FAM.tensors[ew], 64, 4)
    kq, ks, kb = I("e_w", eq), I("e_s", es), I("e_b", eb)
    ex = I("e_x", randn((5, 1, 1, 128)))
    ridx = I("e_idx", mx.array([[2], [0], [3], [3], [1]], mx.uint32))
    case("gather_qmm_rhs", "gather_qmm",
         {"transpose": True, "group_size": 64, "bits": 4, "mode": "affine", "lhs": False,
          "rhs": True, "sorted": False}, [ex, kq, ks, kb, ridx],
         lambda x, q, s, b, r: mx.gather_qmm(x, q, s, b, rhs_indices=r, transpose=True,
                                            group_size=64, bits=4))
    sidx = I("e_sidx", mx.array([0, 1, 1, 3, 3], mx.uint32))
    ex2 = I("e_x2", randn((5, 1, 128)))
    case("gather_qmm_sorted", "gather_qmm",
         {"transpose": True, "group_size": 64, "bits": 4, "mode": "affine", "lhs": False,
          "rhs": True, "sorted": True}, [ex2, kq, ks, kb, sidx],
         lambda x, q, s, b, r: mx.gather_qmm(x, q, s, b, rhs_indices=r, transpose=True,
                                            group_size=64, bits=4, sorted_indices=True))
    gw = I("gm_w", randn((4, 128, 8)))
    case("gather_mm_rhs", "gather_mm", {"lhs": False, "rhs": True, "sorted": False},
         [ex, gw, ridx], lambda a, b, r: mx.gather_mm(a, b, rhs_indices=r))
    la = I("gm_a", randn((3, 2, 128)))
    lidx = I("gm_lidx", mx.array([2, 0], mx.uint32))
    ridx2 = I("gm_ridx", mx.array([1, 3], mx.uint32))
    case("gather_mm_both", "gather_mm", {"lhs": True, "rhs": True, "sorted": False},
         [la, gw, lidx, ridx2], lambda a, b, l, r: mx.gather_mm(a, b, l, r))
    fp = I("fp8_src", randn((4, 8), scale=50.0))
    case("to_fp8", "to_fp8", {}, [fp], mx.to_fp8)
    f8 = I("fp8_bits", mx.to_fp8(FAM.tensors[fp]))
    case("from_fp8_bf16", "from_fp8", {"dtype": "bfloat16"}, [f8],
         lambda v: mx.from_fp8(v, mx.bfloat16))


# ------------------------------------------------------------------- random
def gen_random():
    family("random")
    key = I("key", mx.random.key(1234))
    case("key_7", "random", {"fn": "key", "seed": 7}, [], lambda: mx.random.key(7))
    case("key_big", "random", {"fn": "key", "seed": 2**40 + 5}, [], lambda: mx.random.key(2**40 + 5))
    case("split_2", "random", {"fn": "split", "num": 2}, [key], lambda k: mx.random.split(k))
    case("split_5", "random", {"fn": "split", "num": 5}, [key], lambda k: mx.random.split(k, 5))
    for dt in ("f32", "bf16", "f16"):
        d = DT[dt]
        case(f"normal_{dt}", "random", {"fn": "normal", "shape": [4, 6], "dtype": DNAME[d]},
             [key], lambda k, d=d: mx.random.normal((4, 6), d, key=k))
        case(f"uniform_{dt}", "random", {"fn": "uniform", "shape": [4, 6], "dtype": DNAME[d],
                                         "low": 0.0, "high": 1.0},
             [key], lambda k, d=d: mx.random.uniform(shape=(4, 6), dtype=d, key=k))
        case(f"gumbel_{dt}", "random", {"fn": "gumbel", "shape": [3, 4], "dtype": DNAME[d]},
             [key], lambda k, d=d: mx.random.gumbel((3, 4), d, key=k))
    case("normal_loc_scale", "random", {"fn": "normal", "shape": [5], "dtype": "float32",
                                        "loc": 2.0, "scale": 0.5},
         [key], lambda k: mx.random.normal((5,), loc=2.0, scale=0.5, key=k))
    case("uniform_range", "random", {"fn": "uniform", "shape": [2, 3], "dtype": "float32",
                                     "low": -3.0, "high": 5.0},
         [key], lambda k: mx.random.uniform(-3.0, 5.0, (2, 3), key=k))
    case("randint", "random", {"fn": "randint", "shape": [10], "dtype": "int32", "low": -5,
                               "high": 17},
         [key], lambda k: mx.random.randint(-5, 17, (10,), key=k))
    logits = I("logits", randn((3, 11), scale=2.0))
    case("categorical", "random", {"fn": "categorical", "axis": -1, "num_samples": None},
         [logits, key], lambda l, k: mx.random.categorical(l, key=k))
    case("categorical_n", "random", {"fn": "categorical", "axis": -1, "num_samples": 4},
         [logits, key], lambda l, k: mx.random.categorical(l, num_samples=4, key=k))
    lbf = I("logits_bf16", randn((2, 50), "bf16", scale=2.0))
    case("categorical_bf16", "random", {"fn": "categorical", "axis": -1, "num_samples": None},
         [lbf, key], lambda l, k: mx.random.categorical(l, key=k))
    case("bernoulli", "random", {"fn": "bernoulli", "shape": [3, 4], "p": 0.3}, [key],
         lambda k: mx.random.bernoulli(0.3, (3, 4), key=k))
    pa = I("bern_p", mx.array(RNG.uniform(size=(3, 4)).astype(np.float32)))
    case("bernoulli_arr", "random", {"fn": "bernoulli", "shape": [3, 4], "p": "array"},
         [pa, key], lambda p, k: mx.random.bernoulli(p, (3, 4), key=k))
    case("truncated_normal", "random", {"fn": "truncated_normal", "shape": [6], "low": -1.0,
                                        "high": 2.0, "dtype": "float32"},
         [key], lambda k: mx.random.truncated_normal(-1.0, 2.0, (6,), key=k))
    case("permutation", "random", {"fn": "permutation", "n": 10}, [key],
         lambda k: mx.random.permutation(10, key=k))
    perm_src = I("perm_src", randn((5, 3)))
    case("permutation_array", "random", {"fn": "permutation_array", "axis": 0}, [perm_src, key],
         lambda x, k: mx.random.permutation(x, key=k))

    # Global key: seed, then several draws in order.
    def seq():
        mx.random.seed(42)
        a = mx.random.normal((3,))
        b = mx.random.uniform(shape=(2, 2))
        c = mx.random.randint(0, 100, (4,))
        d = mx.random.categorical(mx.array([[0.0, 1.0, 2.0, 3.0]]))
        mx.random.seed(42)
        e = mx.random.normal((3,))
        return [a, b, c, d, e]

    case("seed_sequence", "random_sequence", {"seed": 42}, [], seq)

    # mlx-lm's compiled sampler (random state as compile input/output) after a seed.
    def sampler(l):
        mx.random.seed(7)
        a = categorical_sampling(l, 0.8)
        b = categorical_sampling(l, 0.8)
        return [a, b]

    from mlx_lm.sample_utils import categorical_sampling

    case("compiled_sampler_sequence", "random_sampler", {"seed": 7, "temp": 0.8}, [lbf], sampler)


# --------------------------------------------------------------- linalg, transforms
def gen_linalg_transforms():
    family("linalg")
    a = RNG.standard_normal((4, 4)).astype(np.float32)
    spd = I("spd", mx.array(a @ a.T + 4 * np.eye(4, dtype=np.float32)))
    m = I("m", mx.array(a))
    b = I("b", randn((4, 2)))
    rect = I("rect", randn((5, 3)))
    cpu = mx.cpu
    case("cholesky", "linalg", {"fn": "cholesky", "upper": False}, [spd],
         lambda v: mx.linalg.cholesky(v, stream=cpu))
    case("cholesky_upper", "linalg", {"fn": "cholesky", "upper": True}, [spd],
         lambda v: mx.linalg.cholesky(v, upper=True, stream=cpu))
    case("inv", "linalg", {"fn": "inv"}, [m], lambda v: mx.linalg.inv(v, stream=cpu))
    case("solve", "linalg", {"fn": "solve"}, [m, b], lambda v, w: mx.linalg.solve(v, w, stream=cpu))
    case("qr", "linalg", {"fn": "qr"}, [rect], lambda v: mx.linalg.qr(v, stream=cpu))
    case("svd", "linalg", {"fn": "svd", "compute_uv": True}, [rect],
         lambda v: mx.linalg.svd(v, stream=cpu))
    case("svd_values", "linalg", {"fn": "svd", "compute_uv": False}, [rect],
         lambda v: [mx.linalg.svd(v, compute_uv=False, stream=cpu)])
    x = I("x", randn((3, 4, 5)))
    case("norm_default", "linalg", {"fn": "norm", "ord": None, "axes": None, "keepdims": False},
         [x], lambda v: mx.linalg.norm(v))
    case("norm_last_kd", "linalg", {"fn": "norm", "ord": None, "axes": [-1], "keepdims": True},
         [x], lambda v: mx.linalg.norm(v, axis=-1, keepdims=True))
    case("norm_ord1", "linalg", {"fn": "norm", "ord": 1.0, "axes": [1], "keepdims": False},
         [x], lambda v: mx.linalg.norm(v, 1, axis=1))
    case("norm_inf", "linalg", {"fn": "norm", "ord": "inf", "axes": [2], "keepdims": False},
         [x], lambda v: mx.linalg.norm(v, float("inf"), axis=2))
    case("norm_fro", "linalg", {"fn": "norm", "ord": "fro", "axes": [1, 2], "keepdims": False},
         [x], lambda v: mx.linalg.norm(v, "fro", axis=(1, 2)))
    xb = I("x_bf16", randn((3, 8), "bf16"))
    case("norm_bf16", "linalg", {"fn": "norm", "ord": None, "axes": [-1], "keepdims": False},
         [xb], lambda v: mx.linalg.norm(v, axis=-1))

    family("transforms")
    x = I("x", randn((3, 4)))
    w = I("w", randn((4, 5)))
    y = I("y", randn((3, 4)))

    def loss(x, w):
        h = mx.matmul(x, w)
        return mx.sum(h * mx.sigmoid(h)) * 0.25

    vg = mx.value_and_grad(loss, argnums=[0, 1])
    case("value_and_grad_loss", "value_and_grad", {"fn": "loss", "argnums": [0, 1]}, [x, w],
         lambda x, w: [vg(x, w)[0], *vg(x, w)[1]])
    vg1 = mx.value_and_grad(loss, argnums=1)
    case("value_and_grad_loss_arg1", "value_and_grad", {"fn": "loss", "argnums": [1]}, [x, w],
         lambda x, w: [vg1(x, w)[0], vg1(x, w)[1]])

    def f_vjp(x):
        return [mx.sin(x) * x, mx.exp(x)]

    c1, c2 = I("cot1", randn((3, 4))), I("cot2", randn((3, 4)))
    case("vjp", "vjp", {"fn": "sin_exp"}, [x, c1, c2],
         lambda x, a, b: (lambda r: [*r[0], *r[1]])(mx.vjp(lambda x: f_vjp(x), [x], [a, b])))

    def f_jvp(x, y):
        return [x * y + mx.tanh(x)]

    t1, t2 = I("tan1", randn((3, 4))), I("tan2", randn((3, 4)))
    case("jvp", "jvp", {"fn": "mul_tanh"}, [x, y, t1, t2],
         lambda x, y, a, b: (lambda r: [*r[0], *r[1]])(mx.jvp(f_jvp, [x, y], [a, b])))

    def g(x, y):
        return [mx.exp(x) * y + mx.sin(x), mx.sum(mx.abs(x - y), axis=-1)]

    cg = mx.compile(g)
    case("compile_g", "compile", {"fn": "g", "shapeless": False}, [x, y], lambda x, y: cg(x, y))
    cgs = mx.compile(g, shapeless=True)
    x2, y2 = I("x2", randn((2, 7))), I("y2", randn((2, 7)))
    case("compile_g_shapeless", "compile", {"fn": "g", "shapeless": True}, [x, y, x2, y2],
         lambda x, y, a, b: [*cgs(x, y), *cgs(a, b)])
    xb, yb = I("x_bf16", randn((3, 4), "bf16")), I("y_bf16", randn((3, 4), "bf16"))
    case("compile_g_bf16", "compile", {"fn": "g", "shapeless": False}, [xb, yb],
         lambda x, y: mx.compile(g)(x, y))
    case("plain_g_bf16", "plain", {"fn": "g"}, [xb, yb], lambda x, y: g(x, y))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(__file__), "..", "..", "goldens", "ops")
    os.makedirs(out, exist_ok=True)
    assert mx.__version__ == "0.32.4", mx.__version__
    mx.set_default_device(mx.cpu)
    gen_elementwise()
    gen_reduce()
    gen_shape_index()
    gen_nn()
    gen_quant()
    gen_random()
    gen_linalg_transforms()
    total = 0
    for name, fam in FAMILIES.items():
        path = os.path.join(out, f"{name}.safetensors")
        mx.save_safetensors(path, fam.tensors, metadata={"mlx": mx.__version__})
        total += os.path.getsize(path)
    # One case per line keeps diffs of regenerated goldens readable.
    with open(os.path.join(out, "manifest.json"), "w") as f:
        f.write('{"mlx_version": %s, "cases": [\n' % json.dumps(mx.__version__))
        f.write(",\n".join(json.dumps(c, separators=(",", ":")) for c in CASES))
        f.write("\n]}\n")
    print(f"{len(CASES)} cases, {total / 1e6:.2f} MB of safetensors in {out}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Our CUDA kernels compiled on a machine without a GPU, as MLX's JIT would compile them.

The device code of `crates/mlx-sys/shim/fast_*.cpp` reaches NVRTC only on a CUDA machine, the
first time a process needs a kernel. This script compiles a representative set of those
kernels here, with the toolchain a device run would use (the `mlx-cuda-13` wheel's headers
and `libmlx.so`, NVIDIA's NVRTC, runtime and CRT wheels from PyPI, fetched once into
~/.cache/mlx-rs/cuda-offline), so that a kernel that does not compile, or one over the
registers a launch of its block size allows, is found before device time is spent on it.

Each kernel's source is assembled as the shim does it (kernel_cache.cpp's
`mlx_kernel_source`: MLX's default header, MLX's device headers read from libmlx.so, the
file's `kDeviceCode`, then the kernel as a `__global__` function of one line); the template
arguments are those the shim's `kernel_for` functions write for the shapes below (the 8B
model's, group sizes 32 / 64 / 128, and every experiment's switch).

    python3 benchmarks/kernel_offline.py                 # compile all, registers and spills
    python3 benchmarks/kernel_offline.py --only sdpa     # names matching a regex
    python3 benchmarks/kernel_offline.py --sass qmv_rows1_k4096_g64 --out /tmp/sass
                                                         # SASS, its opcode counts and its
                                                         # longest loop's (--assume-aligned:
                                                         # x's aligned path alone)
    python3 benchmarks/kernel_offline.py --host-check    # fast_qmv.cpp's one-row bodies on the
                                                         # CPU, both forms (qmv_host_check.cpp)

Exit status 1 when a kernel fails to compile or exceeds its block's register bound.
"""

import argparse
import collections
import ctypes
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIM = ROOT / "crates" / "mlx-sys" / "shim"
CACHE = Path(os.environ.get("MLX_RS_CUDA_OFFLINE", Path.home() / ".cache/mlx-rs/cuda-offline"))
ARCH = "sm_90a"  # the H100 / H200 (our compile() adds "a" from compute capability 9)
WHEELS = [
    "mlx-cuda-13==0.32.4",
    "nvidia-cuda-nvrtc==13.5.37",
    "nvidia-cuda-runtime==13.5.37",
    "nvidia-cuda-crt==13.5.37",
    "nvidia-cuda-cuobjdump==13.5.37",
    "nvidia-cuda-nvdisasm==13.5.37",
]
# kernel_cache.cpp's markers: each MLX device header is the string in libmlx holding it.
HEADER_MARKERS = {
    "utils.cuh": "struct Limits",
    "config.h": "#define MAX_NDIM",
    "complex.cuh": "struct is_complex",
    "fp16_math.cuh": "#define MLX_DEFINE_BINARY_OP",
    "unary_ops.cuh": "struct Sigmoid {",
    "binary_ops.cuh": "struct Multiply {",
    "cast_op.cuh": "struct CastOp",
}
PREFIX = "mlx/backend/cuda/device/"
# --quick: every body and form once, at the 8B's shapes and group size 64.
QUICK = (r"^(qmv_(rows1|rows1_res|rows_n_heads|rows_n_long|swiglu|gather)_k(4096|14336)_g64(_lean)?"
         r"|qmv_rows_m_rw2_k4096_g64(_lean)?|qmv_mma_w8_rw2_m32_k4096_g64(_lean)?|qmv_mma_w4_rw4_m32_k4096_g64"
         r"|qmv_dequant4_g64|qgemm(_gemm_gather|_gemm_runs)?_g64_m64|gemv_(add|swiglu)_k4096|gemv_rows[248]_r[124]_(plain|add|swiglu)_k4096"
         r"|sdpa_pad_(bf16_d128_g2|f16_d64_g4)(_p)?)$")


def toolchain():
    """The unpacked wheels (fetched with pip once); the `site` folder holding them."""
    site = CACHE / "site"
    done = site / ".complete"
    want = "\n".join(WHEELS) + "\n"
    if (site / "mlx" / "lib" / "libmlx.so").exists() and done.exists() and done.read_text() == want:
        return site
    wheels = CACHE / "wheels"
    if wheels.exists():  # another list's wheels: fetched again
        shutil.rmtree(wheels)
    wheels.mkdir(parents=True)
    print(f"fetching the CUDA wheels into {wheels} (once)", file=sys.stderr)
    python = os.environ.get("MLX_PYTHON", sys.executable)
    subprocess.run(
        [python, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), *WHEELS],
        check=True,
    )
    if site.exists():
        shutil.rmtree(site)
    site.mkdir(parents=True)
    for whl in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(whl) as z:
            z.extractall(site)
    for exe in site.glob("nvidia/*/bin/*"):
        exe.chmod(0o755)
    done.write_text(want)
    return site


def mlx_headers(site):
    """MLX's device headers, found in libmlx.so as kernel_cache.cpp finds them."""
    so = (site / "mlx" / "lib" / "libmlx.so").read_bytes()
    found = {}
    for name, marker in HEADER_MARKERS.items():
        texts = set()
        at = so.find(marker.encode())
        while at != -1:
            start = so.rfind(b"\0", 0, at) + 1
            end = so.find(b"\0", at)
            t = so[start : end if end != -1 else len(so)]
            if t.startswith(b"// Copyright"):
                texts.add(t.decode())
            at = so.find(marker.encode(), at + 1)
        if len(texts) == 1:
            found[PREFIX + name] = texts.pop()
    return found


def device_code(file):
    text = (SHIM / file).read_text()
    m = re.search(r'const char\* const kDeviceCode = R"\((.*?)\)";', text, re.S)
    if not m:
        sys.exit(f"no kDeviceCode in {file}")
    return m.group(1)


CUDA_TYPE = {"bf16": "__nv_bfloat16", "f16": "__half", "f32": "float", "u32": "uint32_t", "i32": "int32_t"}


def full_source(func, inputs, outputs, src, code):
    """kernel_cache.cpp's mlx_kernel_source (MLX's build_kernel) around one kernel."""
    header = (
        '#include "mlx/backend/cuda/device/binary_ops.cuh"\n'
        '#include "mlx/backend/cuda/device/unary_ops.cuh"\n' + code
    )
    s = '\n#include "mlx/backend/cuda/device/utils.cuh"\n\n#include <cooperative_groups.h>\n\n'
    s += header
    s += "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n"
    s += f"__global__ void {func}(\n"
    for name, t in inputs:
        s += f"    const {CUDA_TYPE[t]}* {name},\n"
        for sfx, ty in (("_shape", "Shape"), ("_strides", "Strides"), ("_ndim", "int")):
            if name + sfx in src:
                s += f"    const __grid_constant__ {ty} {name}{sfx},\n"
    s += ",\n".join(f"    {CUDA_TYPE[t]}* {n}" for n, t in outputs) + ") {\n"
    s += src + "\n}\n\n} // namespace mlx::core::cu\n"
    return s


def weight(w="w", s="scales", b="biases"):
    return [(w, "u32"), (s, "bf16"), (b, "bf16")]


def kernels():
    """(name, threads a block, inputs, outputs, one-line source, device code file)."""
    out = []
    x = [("x", "bf16")]
    for gs in (32, 64, 128):
        for k in (4096, 14336, 896, 2880):  # 2880: gpt-oss-20b's experts
            if k % gs != 0:
                continue
            t = f"{k}, {gs}"
            # kBody (kOneRow: 4 warps a block, all loads first), with and without the residual.
            # `_lean` (the default; MLX_FAST_QMV_LEAN=0 the other): fewer instructions a chunk, the same values.
            # `_lean_xs` (MLX_FAST_QMV_ALIGNED_SPLIT=1): an unaligned x out of line (row_sum_any).
            for res in (False, True):
                for lean, xs in ((False, False), (True, False), (True, True)):
                    ins = x + weight() + ([("res", "bf16")] if res else [])
                    r = "res" if res else "nullptr"
                    sfx = ("_res" if res else "") + ("_lean" if lean else "") + ("_xs" if xs else "")
                    targ = str(lean).lower() + (", true" if xs else "")
                    out.append((f"qmv_rows1_k{k}_g{gs}{sfx}", 128, ins,
                                [("out0", "bf16")],
                                f"  mlxs_qmv::rows1<{t}, 4, 32, {str(res).lower()}, {targ}>(x, w, scales, biases, out0, 4096, blockIdx.y - 0, {r});",
                                "fast_qmv.cpp"))
            # kBodyRows: layout_for's two pipelined layouts.
            for name, lay in (("heads", "4, 8, 2, false"), ("long", "4, 4, 1, true")):
                for lean, xs in ((False, False), (True, False), (True, True)):
                    sfx = ("_lean" if lean else "") + ("_xs" if xs else "")
                    targ = str(lean).lower() + (", true" if xs else "")
                    out.append((f"qmv_rows_n_{name}_k{k}_g{gs}{sfx}", 128, x + weight(),
                                [("out0", "bf16")],
                                f"  mlxs_qmv::rows_n<{t}, {lay}, false, {targ}>(x, w, scales, biases, out0, 128256, blockIdx.y - 0, nullptr);",
                                "fast_qmv.cpp"))
            # the gathered form (MLX_FAST_GATHER_QMV, on by default): below 8 rows, a row of it a part.
            # (lean, xs): the first form, the lean one, the lean one with the aligned split.
            for lean, xs in ((False, False), (True, False), (True, True)):
                sfx = ("_lean" if lean else "") + ("_xs" if xs else "")
                targ = str(lean).lower() + (", true" if xs else "")
                out.append((f"qmv_gather_k{k}_g{gs}{sfx}", 128,
                            x + weight() + [("idx", "u32")], [("out", "bf16")],
                            f"  mlxs_qmv::gather_rows1<{t}, 4, 32, {targ}>(x, w, scales, biases, idx, out, w_shape[1], idx_shape[0] / x_shape[0], w_shape[0], blockIdx.y, blockIdx.x);",
                            "fast_qmv.cpp"))
                targ = str(lean).lower() + (", mlxs_qmv::NoPre, true" if xs else "")
                out.append((f"qmv_swiglu_k{k}_g{gs}{sfx}", 256,
                            x + weight("w0", "s0", "b0") + weight("w1", "s1", "b1"), [("out", "bf16")],
                            f"  mlxs_qmv::swiglu_rows<{t}, 4, 32, {targ}>(x, w0, s0, b0, w1, s1, b1, out, 14336, blockIdx.y);",
                            "fast_qmv.cpp"))
            # MLX_FAST_QMV_NORM: x as MLX's rms_norm of xr (weight nw) computed in the launch,
            # MLX's rms_norm block shape for this K (fast_qmv.cpp's pending_rms_norm).
            nvec = k // 8
            if k <= 8192:
                bs, nc = ((64, 1) if k <= 512 else (128, nvec // 128) if nvec % 128 == 0 and nvec // 128 <= 8
                          else (64, nvec // 64) if nvec % 64 == 0 and nvec // 64 <= 8 else (128, -(-nvec // 128)))
                pre = f"mlxs_qmv::NormPre<{k}, {bs}, {nc}>"
                eps = "__uint_as_float(0x3727c5acu)"
                xn = [("xr", "bf16"), ("nw", "bf16")]
                out.append((f"qmv_norm_rows1_k{k}_g{gs}_lean", 128, xn + weight(), [("out0", "bf16")],
                            f"  mlxs_qmv::rows1_norm<{t}, 4, 32, {bs}, {nc}, true>(xr, nw, {eps}, w, scales, biases, out0, 4096, blockIdx.y - 0);",
                            "fast_qmv.cpp"))
                out.append((f"qmv_norm_swiglu_k{k}_g{gs}_lean", 256,
                            xn + weight("w0", "s0", "b0") + weight("w1", "s1", "b1"), [("out", "bf16")],
                            f"  mlxs_qmv::swiglu_rows<{t}, 4, 32, true, {pre}>(nullptr, w0, s0, b0, w1, s1, b1, out, 14336, blockIdx.y, {pre}{{xr, nw, {eps}}});",
                            "fast_qmv.cpp"))
            # kBodyM: rw rows of w a warp, kQmmPartRows / rw rows of x, kQmmLoads / rw loads.
            for rw in (1, 2, 4):
                for lean in (False, True):
                    out.append((f"qmv_rows_m_rw{rw}_k{k}_g{gs}{'_lean' if lean else ''}", 128, x + weight(),
                                [("out", "bf16")],
                                f"  mlxs_qmv::rows_m<{t}, 4, {8 // rw}, {8 // rw}, {rw}, {str(lean).lower()}>(x, w, scales, biases, out, w_shape[0], x_shape[0], blockIdx.y, blockIdx.x);",
                                "fast_qmv.cpp"))
            # rows_mma: MLX_FAST_QMM_MMA_WARPS (8 default; 4, 2), 1 or 2 16-row tiles, 8..32 rows
            # (4 tiles under MLX_FAST_QMM_MMA_RW=4 where the partial sums fit 48 KB).
            u = 4 if k % 128 == 0 else (2 if k % 64 == 0 else 1)
            for nw in (8, 4, 2):
                for rw in (1, 2, 4):
                    for mt in (8, 32):
                        if nw * 16 * rw * (mt + 1) * 4 > 48 * 1024:
                            continue
                        for lean in (False, True) if nw == 8 else (False,):
                            out.append((f"qmv_mma_w{nw}_rw{rw}_m{mt}_k{k}_g{gs}{'_lean' if lean else ''}", 32 * nw,
                                        x + weight(), [("out", "bf16")],
                                        f"  mlxs_qmv::rows_mma<{t}, {nw}, {u}, {rw}, {mt // 8}, {str(lean).lower()}>(x, w, scales, biases, out, w_shape[0], x_shape[0], blockIdx.y, blockIdx.x);",
                                        "fast_qmv.cpp"))
        out.append((f"qmv_dequant4_g{gs}", 256, weight(), [("out", "bf16")],
                    f"  mlxs_qmv::dequant4<{gs}>(w, scales, biases, out, w_shape[0] * w_shape[1]);",
                    "fast_qmv.cpp"))
        for bm in (64, 128):
            gq = x + weight()
            out.append((f"qgemm_g{gs}_m{bm}", 256, gq, [("out", "bf16")],
                        f"  mlxs_qgemm::gemm<{gs}, {bm}>(x, w, scales, biases, out, x_shape[0], w_shape[0], x_shape[1]);",
                        "fast_qmm.cpp"))
            gargs = ">(x, w, scales, biases, idx, out, idx_shape[0], w_shape[1], x_shape[1], idx_shape[0] / x_shape[0]);"
            for form in ("gemm_gather", "gemm_runs"):
                out.append((f"qgemm_{form}_g{gs}_m{bm}", 256, gq + [("idx", "u32")], [("out", "bf16")],
                            f"  mlxs_qgemm::{form}<{gs}, {bm}{gargs}", "fast_qmm.cpp"))
    for k in (4096, 14336):
        for form, src in (("add", "gemv_add<{t}>(x, w, res, out, w_shape[0]);"),
                          ("swiglu", "gemv_swiglu<{t}>(x, w, out, w_shape[0] / 2);")):
            t = f"__nv_bfloat16, {k}, 16, 8"
            ins = [("x", "bf16"), ("w", "bf16")] + ([("res", "bf16")] if form == "add" else [])
            out.append((f"gemv_{form}_k{k}", 256, ins, [("out", "bf16")], "  mlxs_gemv::" + src.format(t=t),
                        "fast_gemv.cpp"))
        # the rows form (MLX_FAST_GEMV_ROWS) at 2, 4 and 8 rows of x
        # (MLX_FAST_GEMV_ROWS_R: 1, 2 or 4 rows of w a warp, 16 / R chunks in flight)
        for m in (2, 4, 8):
            for r in (1, 2, 4):
                t = f"__nv_bfloat16, {k}, {16 // r}, 8, {m}, {r}"
                for form, src, res in (
                        ("plain", "gemv_rows<{t}, false>(x, w, w, out, w_shape[0]);", False),
                        ("add", "gemv_rows<{t}, true>(x, w, res, out, w_shape[0]);", True),
                        ("swiglu", "gemv_rows_swiglu<{t}>(x, w, out, w_shape[0] / 2);", False)):
                    ins = [("x", "bf16"), ("w", "bf16")] + ([("res", "bf16")] if res else [])
                    threads = 512 if form == "swiglu" else 256
                    out.append((f"gemv_rows{m}_r{r}_{form}_k{k}", threads, ins, [("out", "bf16")],
                                "  mlxs_gemv::" + src.format(t=t), "fast_gemv.cpp"))
    # fast_sdpa.cpp: heads_per_block's G (G * D / 32 <= 8) for groups of 4 (the 8B), 7
    # (qwen2.5-0.5b) and 8, with and without MLX_SDPA_PADDED_PREFETCH. (A bound of 16 gave
    # 72-92 registers a thread: blocks of 1,024 threads that cannot launch.)
    sdpa_g = set()
    for width in (8,):
        for group in (4, 7, 8):
            for d in (64, 128):
                most = max(1, width // (d // 32))
                g = next((g for g in range(most, 1, -1) if group % g == 0), 1)
                sdpa_g.add((d, g))
    for t in ("bf16", "f16"):
        for d, g in sorted(sdpa_g):
            for p in (False, True):
                name = f"sdpa_pad_{t}_d{d}_g{g}{'_p' if p else ''}"
                ins = [("q", t), ("k", t), ("v", t), ("lp", "i32")]
                src = (f"  mlxs_sdpa::sdpa_padded<{CUDA_TYPE[t]}, {d}, {g}, {str(p).lower()}>(q, k, v, lp, out, "
                       "q_strides.data(), k_strides.data(), v_strides.data(), q_shape[1], k_shape[1], k_shape[2], q_shape[2], 0x1p-3f);")
                out.append((name, 1024, ins, [("out", t)], src, "fast_sdpa.cpp"))
    # fast_mask.cpp: a batch's grammar masks on its logits, one thread a logit.
    for t in ("bf16", "f16", "f32"):
        src = (f"  mlxs_mask::masked_logits<{CUDA_TYPE[t]}>(words, logits, out, logits_shape[0], "
               "logits_shape[1], words_shape[1]);")
        out.append((f"masked_logits_{t}", 256, [("words", "u32"), ("logits", t)], [("out", t)], src,
                    "fast_mask.cpp"))
    return out


class Nvrtc:
    def __init__(self, site):
        lib = next(site.glob("nvidia/cu13/lib/libnvrtc.so*"))
        # NVRTC loads its builtins library by name from the same folder.
        os.environ["LD_LIBRARY_PATH"] = f"{lib.parent}:{os.environ.get('LD_LIBRARY_PATH', '')}"
        ctypes.CDLL(str(next(site.glob("nvidia/cu13/lib/libnvrtc-builtins.so*"))), mode=ctypes.RTLD_GLOBAL)
        self.lib = ctypes.CDLL(str(lib))
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
        self.version = f"{major.value}.{minor.value}"
        inc = site / "mlx" / "include"
        self.opts = ["--device-as-default-execution-space", f"--gpu-architecture={ARCH}",
                     f"--include-path={inc}", f"--include-path={inc / 'cccl'}",
                     f"--include-path={site / 'nvidia' / 'cu13' / 'include'}"]

    def compile(self, name, source, kernel, headers):
        """(cubin bytes or None, log)."""
        lib = self.lib
        prog = ctypes.c_void_p()
        names = [n.encode() for n in headers]
        texts = [t.encode() for t in headers.values()]
        arr = lambda xs: (ctypes.c_char_p * len(xs))(*xs)
        rc = lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), (name + ".cu").encode(),
                                    len(names), arr(texts), arr(names))
        if rc != 0:
            return None, f"nvrtcCreateProgram {rc}"
        lib.nvrtcAddNameExpression(prog, kernel.encode())
        opts = [o.encode() for o in self.opts]
        rc = lib.nvrtcCompileProgram(prog, len(opts), arr(opts))
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        cubin = None
        if rc == 0:
            lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
            buf = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetCUBIN(prog, buf)
            cubin = buf.raw
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
        return cubin, log.value.decode(errors="replace")


def resources(site, cubin_path):
    """Registers, spill stores / loads and shared bytes of the cubin's kernel."""
    cuobjdump = next(site.glob("nvidia/cu13/bin/cuobjdump"))
    text = subprocess.run([str(cuobjdump), "--dump-resource-usage", str(cubin_path)],
                          capture_output=True, text=True, check=True).stdout
    get = lambda key: int(m.group(1)) if (m := re.search(key + r":(\d+)", text)) else 0
    return get("REG"), get("STACK"), get("SHARED"), text


def sass(site, cubin_path):
    nvdisasm = next(site.glob("nvidia/cu13/bin/nvdisasm"))
    return subprocess.run([str(nvdisasm), "-c", str(cubin_path)], capture_output=True, text=True,
                          check=True).stdout


def largest_loop(text):
    """The SASS lines of the longest backward branch's body (a kernel's main loop), or []."""
    lines = text.splitlines()
    labels, best = {}, (0, 0, 0)
    for i, line in enumerate(lines):
        if m := re.match(r"(\.L_x_\d+):", line):
            labels[m.group(1)] = i
        if (m := re.search(r"BRA `\((\.L_x_\d+)\)", line)) and m.group(1) in labels:
            if i - labels[m.group(1)] > best[0]:
                best = (i - labels[m.group(1)], labels[m.group(1)], i)
    return lines[best[1] : best[2] + 1] if best[0] else []


def opcode_counts(text):
    counts = collections.Counter()
    for line in text.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m:
            counts[m.group(1).split(".")[0]] += 1
    return counts


REDUCE_STUB = """// qmv_host_check.cpp's stand-in for cooperative_groups/reduce.h: reduce records each
// lane's value (g_record) and returns it.
#pragma once
#include <vector>
extern std::vector<float> g_record;
namespace cooperative_groups {
struct thread_block {};
inline thread_block this_thread_block() { return {}; }
template <unsigned N>
struct thread_block_tile {};
template <unsigned N, class P>
thread_block_tile<N> tiled_partition(const P&) { return {}; }
template <class T>
struct plus {
  T operator()(T a, T b) const { return a + b; }
};
template <class G, class T, class Op>
T reduce(const G&, T v, Op) {
  g_record.push_back(v);
  return v;
}
}  // namespace cooperative_groups
"""


def host_check(out):
    """fast_qmv.cpp's one-row bodies run on the CPU in both forms (qmv_host_check.cpp)."""
    d = out / "host"
    (d / "cooperative_groups").mkdir(parents=True, exist_ok=True)
    (d / "cooperative_groups" / "reduce.h").write_text(REDUCE_STUB)
    (d / "qmv_device.h").write_text(device_code("fast_qmv.cpp"))
    exe = d / "qmv_host_check"
    cxx = os.environ.get("CXX", "c++")
    subprocess.run([cxx, "-std=c++17", "-O1", "-I", str(d), "-o", str(exe),
                    str(ROOT / "benchmarks" / "qmv_host_check.cpp")], check=True)
    return subprocess.run([str(exe)]).returncode


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="", help="compile only kernels whose names match this regex")
    ap.add_argument("--quick", action="store_true",
                    help="one kernel of each body and form (the test suite's step, ~1 min)")
    ap.add_argument("--sass", default="", help="write the SASS and opcode counts of matching kernels")
    ap.add_argument("--out", default="/tmp/kernel_offline", help="folder for sources, cubins, SASS")
    ap.add_argument("--assume-aligned", action="store_true",
                    help="for --sass: compile with x taken as 16-byte aligned (the kernels test it "
                         "at run time and hold both paths; this counts the aligned one alone; the "
                         "registers shown are then that variant's)")
    ap.add_argument("--host-check", action="store_true",
                    help="also run fast_qmv.cpp's one-row bodies on the CPU, both forms "
                         "(benchmarks/qmv_host_check.cpp; --quick runs it too)")
    args = ap.parse_args()
    if args.host_check or args.quick:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        if host_check(out) != 0:
            print("the one-row bodies' forms differ on the CPU")
            return 1
    site = toolchain()
    headers = mlx_headers(site)
    missing = [n for n in HEADER_MARKERS if PREFIX + n not in headers]
    if missing:
        sys.exit(f"MLX device headers not found in libmlx.so: {missing}")
    nv = Nvrtc(site)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    codes = {}
    failed = 0
    print(f"NVRTC {nv.version}, {ARCH}; sources, cubins and SASS in {out}")
    print(f"{'kernel':44} {'threads':>7} {'regs':>5} {'stack':>6} {'shared':>7}  verdict")
    for name, threads, ins, outs, src, file in kernels():
        if args.only and not re.search(args.only, name):
            continue
        if args.quick and not re.search(QUICK, name):
            continue
        code = codes.setdefault(file, device_code(file))
        func = "custom_kernel_" + name
        if args.assume_aligned:
            # (row_sum's flag is not const: a norm computed in the launch sets it later)
            code = re.sub(r"(const )?bool x_aligned = \(reinterpret_cast<uintptr_t>\(x\) & 15\) == 0;",
                          r"\1bool x_aligned = true;", code)
        source = full_source(func, ins, outs, src, code)
        (out / f"{name}.cu").write_text(source)
        cubin, log = nv.compile(name, source, "mlx::core::cu::" + func, headers)
        if cubin is None:
            failed += 1
            print(f"{name:44} {threads:>7}  FAILED to compile:\n{log}")
            continue
        path = out / f"{name}.cubin"
        path.write_bytes(cubin)
        regs, stack, shared, _ = resources(site, path)
        # A block of `threads` launches only if threads * regs fits the SM's 65,536.
        verdict = "ok"
        if regs * threads > 65536:
            verdict = f"CANNOT LAUNCH ({regs} x {threads} > 65536 registers)"
            failed += 1
        elif stack > 0:
            verdict = "spills to the stack"
        print(f"{name:44} {threads:>7} {regs:>5} {stack:>6} {shared:>7}  {verdict}")
        if args.sass and re.search(args.sass, name):
            text = sass(site, path)
            (out / f"{name}.sass").write_text(text)
            counts = opcode_counts(text)
            total = sum(counts.values())
            top = ", ".join(f"{op} {n}" for op, n in counts.most_common(16))
            print(f"    SASS: {total} instructions; {top}")
            loop = opcode_counts("\n".join(largest_loop(text)))
            if sum(loop.values()) > 8:  # (fully unrolled kernels end in a one-branch trap loop)
                top = ", ".join(f"{op} {n}" for op, n in loop.most_common(12))
                print(f"    its longest loop: {sum(loop.values())} instructions; {top}")
    if failed:
        print(f"{failed} kernel(s) failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

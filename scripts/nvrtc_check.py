"""Compiles the CUDA device code of crates/mlx-sys/shim/fast_qmv.cpp with NVRTC, on any
machine (no GPU needed), for every kernel form the shim builds: one weight on each layout,
several weights in one launch, and the residual add. Catches compile errors before a
device session does.

    python3 scripts/nvrtc_check.py .cache/nvrtc [--arch sm_90]

fetches (once, ~190 MB from PyPI: nvidia-cuda-nvrtc-cu12, nvidia-cuda-runtime-cu12,
nvidia-cuda-cccl-cu12 and MLX's own mlx-cuda-13) and unpacks what it needs into the given
folder.

Each kernel is wrapped the way MLX's `fast::cuda_kernel` wraps a source (its default
header, then the kernel's header, then a `__global__` function with the inputs as
`const T*` and the outputs as `T*` in namespace `mlx::core::cu`). MLX's device headers
(`mlx/backend/cuda/device/*.cuh`) are not files in its wheels but strings inside the CUDA
build's libmlx.so, which its JIT hands to NVRTC by name; this script finds them there
and hands them over the same way.
"""
import argparse
import ctypes
import glob
import os
import re
import subprocess
import sys
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM = os.path.join(HERE, "..", "crates", "mlx-sys", "shim")


def device_code(file="fast_qmv.cpp"):
    src = open(os.path.join(SHIM, file)).read()
    m = re.search(r'const char\* const kDeviceCode = R"\((.*?)\)";', src, re.S)
    if not m:
        sys.exit(f"kDeviceCode not found in {file}")
    return m.group(1)


def swiglu_kernel(name, k, gs, n):
    """The source of the shim's swiglu form (gate and up rows of one block, see kernel_for)."""
    rows, u = 4, 32
    ins = ["const __nv_bfloat16* x"]
    for i in (0, 1):
        ins += [f"const uint32_t* w{i}", f"const __nv_bfloat16* s{i}", f"const __nv_bfloat16* b{i}"]
    call = f"mlxs_qmv::swiglu_rows<{k}, {gs}, {rows}, {u}>(x, w0, s0, b0, w1, s1, b1, out, {n}, blockIdx.y);"
    return wrap(name, ins, ["__nv_bfloat16* out"], f"  {call}\n")


def wrap(name, ins, outs, src, file="fast_qmv.cpp"):
    """MLX's wrapping of a custom kernel's source, with the shim's header."""
    return (
        '#include "mlx/backend/cuda/device/utils.cuh"\n#include <cooperative_groups.h>\n'
        '#include "mlx/backend/cuda/device/binary_ops.cuh"\n'
        + device_code(file)
        + "\nnamespace mlx::core::cu {\nnamespace cg = cooperative_groups;\n"
        + f"__global__ void {name}(\n    " + ",\n    ".join(ins + outs) + ") {\n"
        + src + "}\n}  // namespace mlx::core::cu\n"
    )


def kernel(name, k, gs, layout, ns, res):
    """The source MLX would compile for one of the shim's kernels (see kernel_for)."""
    body, rows, rw, u, win = layout
    tmpl = f"mlxs_qmv::{'rows_n' if body else 'rows1'}<{k}, {gs}, {rows}, {u}"
    if body:
        tmpl += f", {rw}, {'true' if win else 'false'}"
    tmpl += ", true>" if res else ", false>"
    parts = len(ns)
    ins, outs, src, first = ["const __nv_bfloat16* x"], [], "", 0
    for i, n in enumerate(ns):
        sfx = "" if parts == 1 else str(i)
        w, s, b, o = "w" + sfx, ("scales" if parts == 1 else "s" + sfx), ("biases" if parts == 1 else "b" + sfx), "out" + sfx
        ins += [f"const uint32_t* {w}", f"const __nv_bfloat16* {s}", f"const __nv_bfloat16* {b}"]
        outs.append(f"__nv_bfloat16* {o}")
        blocks = (n + rows * rw - 1) // (rows * rw)
        call = f"{tmpl}(x, {w}, {s}, {b}, {o}, {n}, blockIdx.y - {first}, {'res' if res else 'nullptr'});"
        src += f"  if (blockIdx.y < {first + blocks}) {{\n    {call}\n    return;\n  }}\n" if i + 1 < parts else f"  {call}\n"
        first += blocks
    if res:
        ins.append("const __nv_bfloat16* res")
    return wrap(name, ins, outs, src)


def qgemm_kernel(name, gs, bm, form="plain"):
    """The source of fast_qmm.cpp's tiled kernel or a gathered form (`chunks`: gemm_gather,
    `runs`: gemm_runs; see its kernel_for)."""
    ins = ["const __nv_bfloat16* x", "const __grid_constant__ Shape x_shape", "const uint32_t* w",
           "const __grid_constant__ Shape w_shape", "const __nv_bfloat16* scales",
           "const __nv_bfloat16* biases"]
    if form != "plain":
        ins += ["const uint32_t* idx", "const __grid_constant__ Shape idx_shape"]
        fn = "gemm_gather" if form == "chunks" else "gemm_runs"
        call = (f"  mlxs_qgemm::{fn}<{gs}, {bm}>(x, w, scales, biases, idx, out, "
                "idx_shape[0], w_shape[1], x_shape[1], idx_shape[0] / x_shape[0]);\n")
    else:
        call = (f"  mlxs_qgemm::gemm<{gs}, {bm}>(x, w, scales, biases, out, x_shape[0], "
                "w_shape[0], x_shape[1]);\n")
    return wrap(name, ins, ["__nv_bfloat16* out"], call, "fast_qmm.cpp")


WHEELS = ("nvidia-cuda-nvrtc-cu12", "nvidia-cuda-runtime-cu12", "nvidia-cuda-cccl-cu12",
          "mlx-cuda-13==0.32.4")

# MLX's device headers, found among libmlx.so's strings by a line each holds.
MLX_HEADERS = {
    "utils.cuh": "struct Limits",
    "unary_ops.cuh": "struct Sigmoid {\n  template <typename T>\n  __device__",
    "binary_ops.cuh": "struct Multiply {\n  template <typename T>\n  __device__",
    "fp16_math.cuh": "#define MLX_DEFINE_BINARY_OP",
    "complex.cuh": "struct is_complex",
    "cast_op.cuh": "struct CastOp",
}


def mlx_headers(root):
    """(names, sources) of MLX's device headers, from the CUDA wheel's libmlx.so."""
    so = open(os.path.join(root, "mlx", "lib", "libmlx.so"), "rb").read()
    names, srcs = [], []
    for name, marker in MLX_HEADERS.items():
        found = None
        for m in re.finditer(re.escape(marker.encode()), so):
            start = so.rfind(b"\0", 0, m.start()) + 1
            text = so[start:so.find(b"\0", m.start())]
            if text.startswith(b"// Copyright"):
                found = text
                break
        if found is None:
            sys.exit(f"{name} not found in libmlx.so")
        names.append(f"mlx/backend/cuda/device/{name}".encode())
        srcs.append(found)
    config = os.path.join(root, "mlx", "include", "mlx", "backend", "cuda", "device", "config.h")
    names.append(b"mlx/backend/cuda/device/config.h")
    srcs.append(open(config, "rb").read())
    return names, srcs


def fetch(root):
    """Downloads and unpacks the CUDA wheels into `root` unless they are there."""
    if os.path.exists(os.path.join(root, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.12")) and \
            os.path.exists(os.path.join(root, "mlx", "lib", "libmlx.so")):
        return
    dl = os.path.join(root, "wheels")
    os.makedirs(dl, exist_ok=True)
    print(f"fetching {', '.join(WHEELS)} into {dl}", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", dl, *WHEELS],
                   check=True)
    for w in glob.glob(os.path.join(dl, "*.whl")):
        with zipfile.ZipFile(w) as z:
            z.extractall(root)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root", help="folder for the CUDA wheels (nvidia/cuda_nvrtc, ...)")
    ap.add_argument("--arch", default="sm_90")
    a = ap.parse_args()
    fetch(a.root)
    nv = os.path.join(a.root, "nvidia")
    lib = ctypes.CDLL(os.path.join(nv, "cuda_nvrtc", "lib", "libnvrtc.so.12"))
    incs = [os.path.join(nv, d, "include") for d in ("cuda_runtime", "cuda_cccl")]
    opts = [f"--gpu-architecture={a.arch}".encode(), b"-std=c++17", b"--device-as-default-execution-space"]
    opts += [f"-I{i}".encode() for i in incs]
    one, window, two_rows = (0, 4, 1, 32, False), (1, 4, 1, 4, True), (1, 4, 2, 8, False)
    cases = [
        ("one row a warp", 2048, 64, one, [2048], False),
        ("K not a multiple of 512", 4864, 64, one, [896], False),
        ("window layout", 14336, 64, window, [4096], False),
        ("two rows a warp", 2048, 32, two_rows, [128256], False),
        ("q/k/v in one launch", 896, 64, one, [896, 128, 128], False),
        ("gate/up in one launch", 2048, 128, one, [8192, 8192], False),
        ("residual, one row a warp", 2048, 64, one, [2048], True),
        ("residual, window layout", 14336, 128, window, [4096], True),
        ("swiglu of gate/up", 2048, 64, None, [8192], False),
        ("swiglu, K not a multiple of 512", 896, 32, None, [4864], False),
    ]
    hnames, hsrcs = mlx_headers(a.root)
    hn = (ctypes.c_char_p * len(hnames))(*hnames)
    hs = (ctypes.c_char_p * len(hsrcs))(*hsrcs)
    failed = 0
    for gs in (32, 64, 128):
        for bm in (64, 128):
            cases.append((f"tiled kernel, {bm} rows a block", 0, gs, ("qgemm", bm, "plain"), [], False))
        cases.append(("tiled kernel, gathered, 64 rows a block", 0, gs, ("qgemm", 64, "chunks"), [], False))
        cases.append(("tiled kernel, gathered runs, 16 rows a block", 0, gs, ("qgemm", 16, "runs"), [], False))
    for i, (what, k, gs, layout, ns, res) in enumerate(cases):
        if layout is None:
            src = swiglu_kernel(f"mlxs_check_{i}", k, gs, ns[0]).encode()
        elif layout[0] == "qgemm":
            src = qgemm_kernel(f"mlxs_check_{i}", gs, layout[1], layout[2]).encode()
        else:
            src = kernel(f"mlxs_check_{i}", k, gs, layout, ns, res).encode()
        prog = ctypes.c_void_p()
        rc = lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"check.cu", len(hnames), hs, hn)
        if rc:
            sys.exit(f"nvrtcCreateProgram failed ({rc})")
        arr = (ctypes.c_char_p * len(opts))(*opts)
        tic = time.perf_counter()
        rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
        took = time.perf_counter() - tic
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        ok = rc == 0
        failed += not ok
        print(f"{'compiles' if ok else 'FAILS'}: {what} (K={k}, group {gs}, N={ns}) in {took:.2f} s")
        if not ok:
            print(log.value.decode(errors="replace"))
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

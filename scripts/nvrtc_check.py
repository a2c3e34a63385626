"""Compiles the CUDA device code of crates/mlx-sys/shim/fast_qmv.cpp with NVRTC, on any
machine (no GPU needed), for every kernel form the shim builds: one weight on each layout,
several weights in one launch, and the residual add. Catches compile errors before a
device session does.

    python3 scripts/nvrtc_check.py .cache/nvrtc [--arch sm_90]

fetches (once, ~100 MB from PyPI: nvidia-cuda-nvrtc-cu12, nvidia-cuda-runtime-cu12,
nvidia-cuda-cccl-cu12) and unpacks the CUDA wheels it needs into the given folder.

Each kernel is wrapped the way MLX's `fast::cuda_kernel` wraps a source (a `__global__`
function with the inputs as `const T*` and the outputs as `T*` in namespace
`mlx::core::cu`, after its default header); MLX's own `device/utils.cuh` is not in its
wheels, so the bfloat16 and cooperative-groups headers it brings stand in for it.
"""
import argparse
import ctypes
import glob
import os
import re
import subprocess
import sys
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM = os.path.join(HERE, "..", "crates", "mlx-sys", "shim", "fast_qmv.cpp")


def device_code():
    src = open(SHIM).read()
    m = re.search(r'const char\* const kDeviceCode = R"\((.*?)\)";', src, re.S)
    if not m:
        sys.exit("kDeviceCode not found in fast_qmv.cpp")
    return m.group(1)


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
    return (
        "#include <cuda_bf16.h>\n#include <cooperative_groups.h>\n#include <cuda/std/cstdint>\n"
        "using cuda::std::uint8_t;\nusing cuda::std::uint32_t;\nusing cuda::std::uintptr_t;\n"
        + device_code()
        + "\nnamespace mlx::core::cu {\nnamespace cg = cooperative_groups;\n"
        + f"__global__ void {name}(\n    " + ",\n    ".join(ins + outs) + ") {\n"
        + src + "}\n}  // namespace mlx::core::cu\n"
    )


WHEELS = ("nvidia-cuda-nvrtc-cu12", "nvidia-cuda-runtime-cu12", "nvidia-cuda-cccl-cu12")


def fetch(root):
    """Downloads and unpacks the CUDA wheels into `root` unless they are there."""
    if os.path.exists(os.path.join(root, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.12")):
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
    ]
    failed = 0
    for i, (what, k, gs, layout, ns, res) in enumerate(cases):
        src = kernel(f"mlxs_check_{i}", k, gs, layout, ns, res).encode()
        prog = ctypes.c_void_p()
        rc = lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"check.cu", 0, None, None)
        if rc:
            sys.exit(f"nvrtcCreateProgram failed ({rc})")
        arr = (ctypes.c_char_p * len(opts))(*opts)
        rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        ok = rc == 0
        failed += not ok
        print(f"{'compiles' if ok else 'FAILS'}: {what} (K={k}, group {gs}, N={ns})")
        if not ok:
            print(log.value.decode(errors="replace"))
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

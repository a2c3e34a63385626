// kernel_cache.cpp: see kernel_cache.h. Everything CUDA is reached through dlopen (this
// file is built against MLX's CPU headers as well): NVRTC as the library MLX itself has
// loaded, the driver for the device's compute capability.
#include "kernel_cache.h"

#include "kernel_switch.h"

#include "mlx/backend/cuda/cuda.h"

#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <set>

namespace mx = mlx::core;
namespace fs = std::filesystem;

namespace mlxs_detail {
namespace {

KernelSwitch g_cache("MLX_FAST_KERNEL_CACHE");
std::atomic<unsigned long long> g_compiles{0};
std::atomic<unsigned long long> g_hits{0};

// Why a kernel was left to MLX's compiler, on stderr when MLX_FAST_KERNEL_CACHE_VERBOSE=1.
bool skipped(const std::string& name, const std::string& why) {
  static const bool verbose = [] {
    const char* v = std::getenv("MLX_FAST_KERNEL_CACHE_VERBOSE");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  if (verbose) std::fprintf(stderr, "kernel cache: %s left to MLX: %s\n", name.c_str(), why.c_str());
  return false;
}

// What MLX's `fast::cuda_kernel` puts around a kernel's source (MLX 0.32's custom_kernel
// and its dtype_to_cuda_type): its default header, the kernel's header, then the kernel
// as a `__global__` function in namespace mlx::core::cu taking each input as `const T*`
// (followed by its shape, strides and rank where the source names them) and each output
// as `T*`.
std::optional<std::string> mlx_kernel_source(const std::string& func,
                                             const std::vector<KernelParam>& inputs,
                                             const std::vector<KernelParam>& outputs,
                                             const std::string& source,
                                             const std::string& header) {
  if (outputs.empty()) return std::nullopt;
  std::string s =
      "\n#include \"mlx/backend/cuda/device/utils.cuh\"\n\n#include <cooperative_groups.h>\n\n";
  s += header;
  s += "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n";
  s += "__global__ void " + func + "(\n";
  for (const auto& [name, dtype] : inputs) {
    const char* t = cuda_type(dtype);
    if (t == nullptr) return std::nullopt;
    s += std::string("    const ") + t + "* " + name + ",\n";
    if (source.find(name + "_shape") != std::string::npos) {
      s += "    const __grid_constant__ Shape " + name + "_shape,\n";
    }
    if (source.find(name + "_strides") != std::string::npos) {
      s += "    const __grid_constant__ Strides " + name + "_strides,\n";
    }
    if (source.find(name + "_ndim") != std::string::npos) {
      s += "    const __grid_constant__ int " + name + "_ndim,\n";
    }
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const char* t = cuda_type(outputs[i].second);
    if (t == nullptr) return std::nullopt;
    s += std::string("    ") + t + "* " + outputs[i].first;
    s += i + 1 < outputs.size() ? ",\n" : ") {\n";
  }
  s += source;
  s += "\n}\n\n} // namespace mlx::core::cu\n";
  return s;
}

// MLX's PTX cache folder (`MLX_PTX_CACHE_DIR`, else `<temp>/mlx/<version>/ptx`), made if
// missing; empty where it cannot be.
const fs::path& ptx_cache_dir() {
  static const fs::path dir = []() -> fs::path {
    std::error_code ec;
    fs::path d;
    if (const char* c = std::getenv("MLX_PTX_CACHE_DIR"); c != nullptr) {
      d = c;
    } else {
      const fs::path tmp = fs::temp_directory_path(ec);
      if (ec) return {};
      d = tmp / "mlx" / mx::version() / "ptx";
    }
    if (!fs::exists(d, ec) && !fs::create_directories(d, ec)) return {};
    return d;
  }();
  return dir;
}

// Where MLX looks for a module: `<dir>/<module>.ptx`, long names cut into folders of 245
// characters.
fs::path ptx_path(const fs::path& dir, const std::string& module) {
  constexpr size_t kMaxName = 245;
  fs::path p = dir;
  size_t off = 0;
  while (module.size() - off > kMaxName) {
    p /= module.substr(off, kMaxName);
    off += kMaxName;
  }
  return p / (module.substr(off) + ".ptx");
}

// The NVRTC entry points we call, from the library already loaded in this process (MLX's);
// every pointer null where there is none.
struct Nvrtc {
  int (*create)(void**, const char*, const char*, int, const char* const*,
                const char* const*) = nullptr;
  int (*destroy)(void**) = nullptr;
  int (*compile)(void*, int, const char* const*) = nullptr;
  int (*add_name)(void*, const char*) = nullptr;
  int (*lowered_name)(void*, const char*, const char**) = nullptr;
  int (*cubin_size)(void*, size_t*) = nullptr;
  int (*cubin)(void*, char*) = nullptr;
  int (*ptx_size)(void*, size_t*) = nullptr;
  int (*ptx)(void*, char*) = nullptr;
  int (*version)(int*, int*) = nullptr;
  bool ok() const {
    return create && destroy && compile && add_name && lowered_name && cubin_size && cubin &&
           ptx_size && ptx && version;
  }
};

int find_nvrtc(dl_phdr_info* info, size_t, void* data) {
  const char* name = info->dlpi_name;
  if (name != nullptr && std::strstr(name, "/libnvrtc.so") != nullptr) {
    *static_cast<std::string*>(data) = name;
    return 1;
  }
  return 0;
}

template <typename F>
void bind(void* lib, const char* sym, F& f) {
  f = reinterpret_cast<F>(dlsym(lib, sym));
}

const Nvrtc& nvrtc() {
  static const Nvrtc api = [] {
    Nvrtc a;
    std::string path;
    dl_iterate_phdr(find_nvrtc, &path);
    void* lib = path.empty() ? nullptr : dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) return a;
    bind(lib, "nvrtcCreateProgram", a.create);
    bind(lib, "nvrtcDestroyProgram", a.destroy);
    bind(lib, "nvrtcCompileProgram", a.compile);
    bind(lib, "nvrtcAddNameExpression", a.add_name);
    bind(lib, "nvrtcGetLoweredName", a.lowered_name);
    bind(lib, "nvrtcGetCUBINSize", a.cubin_size);
    bind(lib, "nvrtcGetCUBIN", a.cubin);
    bind(lib, "nvrtcGetPTXSize", a.ptx_size);
    bind(lib, "nvrtcGetPTX", a.ptx);
    bind(lib, "nvrtcVersion", a.version);
    return a;
  }();
  return api;
}

// The compute capability of CUDA device `ordinal`, from the driver.
std::optional<std::pair<int, int>> compute_capability(int ordinal) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) return std::nullopt;
  int (*get)(int*, int) = nullptr;
  int (*attr)(int*, int, int) = nullptr;
  bind(lib, "cuDeviceGet", get);
  bind(lib, "cuDeviceGetAttribute", attr);
  int dev = 0, major = 0, minor = 0;
  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR
  if (get == nullptr || attr == nullptr || get(&dev, ordinal) != 0 || attr(&major, 75, dev) != 0 ||
      attr(&minor, 76, dev) != 0) {
    return std::nullopt;
  }
  return std::make_pair(major, minor);
}

// MLX's rule for compiling to the device's own code (a cubin) rather than PTX.
bool nvrtc_supports_sass(int nv_major, int nv_minor, int cc_major, int cc_minor) {
  auto at_most = [&](int ma, int mi) { return cc_major < ma || (cc_major == ma && cc_minor <= mi); };
  if (nv_major < 9) return false;
  if (nv_major == 9) return at_most(7, 2);
  if (nv_major == 10) return at_most(7, 5);
  if (nv_major == 11 && nv_minor == 0) return at_most(8, 0);
  if (nv_major == 11 && nv_minor < 8) return at_most(8, 6);
  return true;
}

// The folder of the libmlx this process runs.
fs::path libmlx_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&mx::version), &info) == 0 || info.dli_fname == nullptr) {
    return {};
  }
  return fs::path(info.dli_fname).parent_path();
}

// MLX's NVRTC include paths: its bundled headers, CCCL, the CUDA runtime's headers.
std::optional<std::vector<std::string>> include_args(int nv_major) {
  std::error_code ec;
  const fs::path lib = libmlx_dir();
  if (lib.empty()) return std::nullopt;
  const fs::path root = lib.parent_path();
  std::vector<std::string> args;
  const fs::path inc = root / "include";
  if (fs::exists(inc, ec)) args.push_back("--include-path=" + inc.string());
  if (fs::exists(inc / "cccl", ec)) args.push_back("--include-path=" + (inc / "cccl").string());
  fs::path cuda = root.parent_path() / "nvidia" / (nv_major >= 13 ? "cu13" : "cuda_runtime") /
                  "include";
  if (!fs::exists(cuda, ec)) {
    const char* home = std::getenv("CUDA_HOME");
    if (home == nullptr) home = std::getenv("CUDA_PATH");
    cuda = fs::path(home != nullptr ? home : "/usr/local/cuda") / "include";
    if (!fs::exists(cuda, ec)) return std::nullopt;
  }
  args.push_back("--include-path=" + cuda.string());
  return args;
}

// MLX's device headers (its JIT hands them to NVRTC from memory: they are not files of
// its wheels), as strings inside libmlx, each found by a line only it holds. A header is
// taken only where every copy of it agrees.
constexpr const char* kIncludePrefix = "mlx/backend/cuda/device/";
const std::map<std::string, std::string>& mlx_device_headers() {
  static const std::map<std::string, std::string> headers = [] {
    static const std::pair<const char*, const char*> kMarkers[] = {
        {"utils.cuh", "struct Limits"},
        {"config.h", "#define MAX_NDIM"},
        {"complex.cuh", "struct is_complex"},
        {"fp16_math.cuh", "#define MLX_DEFINE_BINARY_OP"},
        {"unary_ops.cuh", "struct Sigmoid {"},
        {"binary_ops.cuh", "struct Multiply {"},
        {"cast_op.cuh", "struct CastOp"},
    };
    std::map<std::string, std::string> found;
    const fs::path dir = libmlx_dir();
    if (dir.empty()) return found;
    std::ifstream f(dir / "libmlx.so", std::ios::binary);
    if (!f) return found;
    const std::string so((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    for (const auto& [name, marker] : kMarkers) {
      std::optional<std::string> text;
      bool agree = true;
      for (size_t at = so.find(marker); at != std::string::npos; at = so.find(marker, at + 1)) {
        const size_t nul = so.rfind('\0', at);
        const size_t start = nul == std::string::npos ? 0 : nul + 1;
        const size_t end = so.find('\0', at);
        std::string t = so.substr(start, (end == std::string::npos ? so.size() : end) - start);
        if (t.rfind("// Copyright", 0) != 0) continue;
        if (text && *text != t) agree = false;
        text = std::move(t);
      }
      if (text && agree) found.emplace(std::string(kIncludePrefix) + name, std::move(*text));
    }
    return found;
  }();
  return headers;
}

// MLX's device headers that `text` includes, directly or through others; nullopt where one
// of them was not found.
std::optional<std::vector<std::pair<std::string, std::string>>> headers_for(
    const std::string& text) {
  const auto& all = mlx_device_headers();
  std::set<std::string> seen;
  std::vector<std::string> todo{text};
  std::vector<std::pair<std::string, std::string>> out;
  const std::string needle = std::string("#include \"") + kIncludePrefix;
  while (!todo.empty()) {
    const std::string t = std::move(todo.back());
    todo.pop_back();
    for (size_t at = t.find(needle); at != std::string::npos; at = t.find(needle, at + 1)) {
      const size_t start = at + std::strlen("#include \"");
      const size_t end = t.find('"', start);
      if (end == std::string::npos) return std::nullopt;
      const std::string name = t.substr(start, end - start);
      if (!seen.insert(name).second) continue;
      auto it = all.find(name);
      if (it == all.end()) return std::nullopt;
      out.emplace_back(name, it->second);
      todo.push_back(it->second);
    }
  }
  return out;
}

// Compiles `source` as MLX's JIT would: the cubin (or PTX) and the mangled name of
// `kernel`, or nullopt.
std::optional<std::pair<std::string, std::string>> compile(const std::string& module,
                                                            const std::string& source,
                                                            const std::string& kernel,
                                                            int device) {
  const Nvrtc& nv = nvrtc();
  int nv_major = 0, nv_minor = 0;
  if (!nv.ok() || nv.version(&nv_major, &nv_minor) != 0) {
    skipped(module, "no NVRTC library loaded in this process");
    return std::nullopt;
  }
  const auto cc = compute_capability(device);
  const auto incs = include_args(nv_major);
  const auto headers = headers_for(source);
  if (!cc) skipped(module, "no compute capability for device " + std::to_string(device));
  if (!incs) skipped(module, "CUDA headers not found (as MLX looks for them)");
  if (!headers) skipped(module, "MLX's device headers not found in libmlx");
  if (!cc || !incs || !headers) return std::nullopt;
  const bool sass = nvrtc_supports_sass(nv_major, nv_minor, cc->first, cc->second);
  const std::string arch = std::string("--gpu-architecture=") + (sass ? "sm" : "compute") + "_" +
                           std::to_string(cc->first) + std::to_string(cc->second) +
                           (cc->first >= 9 ? "a" : "");
  std::vector<const char*> opts{"--device-as-default-execution-space", arch.c_str()};
  for (const auto& a : *incs) opts.push_back(a.c_str());
  std::vector<const char*> names, texts;
  for (const auto& [n, t] : *headers) {
    names.push_back(n.c_str());
    texts.push_back(t.c_str());
  }
  void* prog = nullptr;
  const std::string file = module + ".cu";
  if (nv.create(&prog, source.c_str(), file.c_str(), static_cast<int>(names.size()),
                texts.data(), names.data()) != 0) {
    return std::nullopt;
  }
  std::optional<std::pair<std::string, std::string>> out;
  const char* mangled = nullptr;
  size_t size = 0;
  const bool compiled = nv.add_name(prog, kernel.c_str()) == 0 &&
                        nv.compile(prog, static_cast<int>(opts.size()), opts.data()) == 0;
  if (!compiled) skipped(module, "NVRTC failed to compile it (" + arch + ")");
  if (compiled &&
      nv.lowered_name(prog, kernel.c_str(), &mangled) == 0 && mangled != nullptr &&
      (sass ? nv.cubin_size(prog, &size) : nv.ptx_size(prog, &size)) == 0) {
    std::string code(size, '\0');
    if ((sass ? nv.cubin(prog, code.data()) : nv.ptx(prog, code.data())) == 0) {
      out = std::make_pair(std::move(code), std::string(mangled));
    }
  }
  nv.destroy(&prog);
  return out;
}


// 64-bit FNV-1a, to name device-code files and kernels by their content.
unsigned long long fnv1a(const std::string& s) {
  unsigned long long h = 14695981039346656037ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// Whether `path` holds exactly `text`.
bool file_holds(const std::string& path, const std::string& text) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::string got((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return got == text;
}

// Writes `code` to `path` unless it already holds it (to a temporary name, then renamed,
// so concurrent processes never see a partial file); whether `path` holds it after.
bool write_once(const std::string& path, const std::string& code) {
  if (file_holds(path, code)) return true;
  return write_file_atomically(path, code) && file_holds(path, code);
}

// Where a device code goes: `$XDG_CACHE_HOME` or `~/.cache`, `mlx-rs/kernels/`, named by
// its prefix and the content's hash; empty where there is no such directory or its path
// would need escaping between the quotes of an #include.
std::string device_code_path(const DeviceCode& code) {
  std::string base;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x == '/') {
    base = x;
  } else if (const char* h = std::getenv("HOME"); h != nullptr && *h == '/') {
    base = std::string(h) + "/.cache";
  }
  if (base.empty() || base.find_first_of("\"\\\n") != std::string::npos) return "";
  char name[96];
  std::snprintf(name, sizeof(name), "%s_%016llx.cuh", code.prefix, fnv1a(code.text));
  std::error_code ec;
  const fs::path dir = fs::path(base) / "mlx-rs" / "kernels";
  fs::create_directories(dir, ec);
  return (dir / name).string();
}

// The `header` of a kernel about to be built: an #include of the file holding the device
// code (checked, and written if missing, each time a kernel is built, since NVRTC reads it
// then), or the device code itself where no such file can be written: the same kernels,
// at a higher host cost per launch (see device_kernel).
// MLX's own device headers come first (its JIT compiler has them in memory): fast_qmv's
// swiglu form calls MLX's `Sigmoid` and `Multiply` functors.
std::string device_header(const DeviceCode& code) {
  const std::string mlx_headers =
      "#include \"mlx/backend/cuda/device/binary_ops.cuh\"\n"
      "#include \"mlx/backend/cuda/device/unary_ops.cuh\"\n";
  static std::mutex mu;
  static std::map<std::string, std::string> paths;  // by prefix
  std::string path;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = paths.find(code.prefix);
    if (it == paths.end()) it = paths.emplace(code.prefix, device_code_path(code)).first;
    path = it->second;
  }
  if (path.empty() || !write_once(path, code.text)) return mlx_headers + code.text;
  return mlx_headers + "#include \"" + path + "\"\n";
}

}  // namespace

bool write_file_atomically(const std::string& path, const std::string& bytes) {
  std::error_code ec;
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!f.flush()) {
      fs::remove(tmp, ec);
      return false;
    }
  }
  fs::rename(tmp, path, ec);
  if (ec) fs::remove(tmp, ec);
  return !ec;
}

bool ensure_kernel_cached(const std::string& name,
                          const std::vector<KernelParam>& inputs,
                          const std::vector<KernelParam>& outputs,
                          const std::string& source,
                          const std::string& header,
                          int device) {
  if (!g_cache.on()) return false;
  try {
    const std::string func = "custom_kernel_" + name;
    const auto full = mlx_kernel_source(func, inputs, outputs, source, header);
    const fs::path& dir = ptx_cache_dir();
    if (!full) return skipped(name, "a parameter type MLX's wrapper does not name");
    if (dir.empty()) return skipped(name, "no PTX cache folder");
    char hash[32];
    std::snprintf(hash, sizeof(hash), "_%zx", std::hash<std::string>{}(*full));
    const std::string module = func + hash;
    fs::path ptx = ptx_path(dir, module);
    std::error_code ec;
    if (fs::exists(ptx, ec)) {
      g_hits.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
    static std::mutex mu;
    std::lock_guard<std::mutex> lock(mu);
    const std::string kernel = "mlx::core::cu::" + func;
    auto built = compile(module, *full, kernel, device);
    if (!built) return false;  // (said why)
    fs::create_directories(ptx.parent_path(), ec);
    fs::path txt = ptx;
    txt.replace_extension(".txt");
    fs::path cu = ptx;
    cu.replace_extension(".cu");
    // The mangled name first: MLX reads it once it has found the module.
    if (!write_file_atomically(txt.string(), kernel + "\t" + built->second + "\n") ||
        !write_file_atomically(cu.string(), *full) ||
        !write_file_atomically(ptx.string(), built->first)) {
      return skipped(name, "cannot write " + ptx.string());
    }
    g_compiles.fetch_add(1, std::memory_order_relaxed);
    return true;
  } catch (const std::exception& e) {
    return skipped(name, e.what());
  }
}

void set_kernel_cache(bool on) { g_cache.set(on); }
unsigned long long kernel_cache_compiles() {
  return g_compiles.load(std::memory_order_relaxed);
}
unsigned long long kernel_cache_hits() { return g_hits.load(std::memory_order_relaxed); }

const char* cuda_type(mx::Dtype d) {
  switch (d.val()) {
    case mx::Dtype::Val::bool_: return "bool";
    case mx::Dtype::Val::int8: return "int8_t";
    case mx::Dtype::Val::int16: return "int16_t";
    case mx::Dtype::Val::int32: return "int32_t";
    case mx::Dtype::Val::int64: return "int64_t";
    case mx::Dtype::Val::uint8: return "uint8_t";
    case mx::Dtype::Val::uint16: return "uint16_t";
    case mx::Dtype::Val::uint32: return "uint32_t";
    case mx::Dtype::Val::uint64: return "uint64_t";
    case mx::Dtype::Val::float16: return "__half";
    case mx::Dtype::Val::bfloat16: return "__nv_bfloat16";
    case mx::Dtype::Val::float32: return "float";
    case mx::Dtype::Val::float64: return "double";
    default: return nullptr;
  }
}

// Whether our kernels may run on `st` for the activations `x`: a CUDA GPU stream, and `x`
// not a tracer of a function transformation (vjp, jvp: inside a training step's forward,
// where x depends on trained parameters). MLX's custom kernels have no derivatives, so
// there MLX's own products run, as mlx-lm's do. (MLX's own flag for a gradient trace is
// not exported from libmlx; an op's output is a tracer when one of its inputs is.)
bool on_gpu(const mx::Stream& st, const mx::array& x) {
  return st.device.type == mx::Device::gpu && mx::cu::is_available() && !x.is_tracer();
}

mx::fast::CustomKernelFunction device_kernel(std::string name,
                                             const std::vector<KernelParam>& inputs,
                                             const std::vector<KernelParam>& outputs,
                                             const std::string& src, const DeviceCode& code,
                                             int device, bool ensure_row_contiguous,
                                             int shared_memory) {
  char tag[24];
  std::snprintf(tag, sizeof(tag), "_h%016llx", fnv1a(std::string(code.text) + src));
  name += tag;
  const std::string header = device_header(code);
  std::vector<std::string> input_names;
  for (const auto& p : inputs) input_names.push_back(p.first);
  std::vector<std::string> output_names;
  for (const auto& o : outputs) output_names.push_back(o.first);
  ensure_kernel_cached(name, inputs, outputs, src, header, device);
  return mx::fast::cuda_kernel(name, input_names, output_names, src, header,
                               ensure_row_contiguous, shared_memory);
}

}  // namespace mlxs_detail

// kernel_switch.h: internal to the shim. The on/off switch and use count of one of our
// kernels: on unless its environment variable is "0" at first use (or, for a switch made
// off by default, off unless it is "1"), settable at any time.
#pragma once

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace mlxs_detail {

// A non-negative integer from the environment variable `name`, else `fallback`.
inline long long env_count(const char* name, long long fallback) {
  const char* e = std::getenv(name);
  if (e == nullptr || *e == '\0') return fallback;
  char* end = nullptr;
  long long n = std::strtoll(e, &end, 10);
  return (end != nullptr && *end == '\0' && n >= 0) ? n : fallback;
}

class KernelSwitch {
 public:
  explicit KernelSwitch(const char* env, bool on_by_default = true)
      : env_(env), default_(on_by_default) {}

  bool on() {
    int s = state_.load(std::memory_order_relaxed);
    if (s < 0) {
      const char* v = std::getenv(env_);
      if (default_) {
        s = (v != nullptr && std::strcmp(v, "0") == 0) ? 0 : 1;
      } else {
        s = (v != nullptr && std::strcmp(v, "1") == 0) ? 1 : 0;
      }
      state_.store(s, std::memory_order_relaxed);
    }
    return s == 1;
  }
  void set(bool on) { state_.store(on ? 1 : 0, std::memory_order_relaxed); }
  void count() { uses_.fetch_add(1, std::memory_order_relaxed); }
  unsigned long long uses() const { return uses_.load(std::memory_order_relaxed); }

 private:
  const char* env_;
  bool default_;
  std::atomic<int> state_{-1};
  std::atomic<unsigned long long> uses_{0};
};

}  // namespace mlxs_detail

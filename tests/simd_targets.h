// Running a check once per SIMD target, for the tests of the dispatched kernels.
#pragma once
#include <hwy/targets.h>

#include <cstdint>
#include <vector>

// Restores Highway's own choice of SIMD target when it goes out of scope, also when a check
// throws, so that a failed test leaves no target forced on the tests after it.
struct RestoreTargets {
  ~RestoreTargets() { hwy::SetSupportedTargetsForTest(0); }
};

// Calls fn(target) with each SIMD target that the kernels were built for and this CPU runs
// selected in turn, then restores the default. with_avx3_dl adds AVX3_DL (AVX-512 with VNNI),
// which only the quantized attention builds (Highway's default list lacks it).
template <class Fn>
void for_each_simd_target(const Fn& fn, bool with_avx3_dl = false) {
  const RestoreTargets restore;
  std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  if (with_avx3_dl && (hwy::SupportedTargets() & HWY_AVX3_DL)) targets.push_back(HWY_AVX3_DL);
  for (int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    fn(target);
  }
}

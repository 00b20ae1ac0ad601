// Per-target fp16 <-> fp32 vector conversions (include inside a foreach_target translation unit).
// x86 targets with F16C use the hardware instructions; other targets use integer code that
// produces the same bits: round to nearest even, subnormals kept, NaN quieted with its payload.
#if defined(FD_KERNELS_F16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef FD_KERNELS_F16_INL_H_
#undef FD_KERNELS_F16_INL_H_
#else
#define FD_KERNELS_F16_INL_H_
#endif

#include <cstdint>

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace fd::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#undef FD_NATIVE_F16
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
#define FD_NATIVE_F16 1
#else
#define FD_NATIVE_F16 0
#endif

// Widens Lanes(df) fp16 bit patterns, held as uint16_t lanes, to fp32.
template <class DF>
HWY_INLINE hn::Vec<DF> WidenF16(DF df, hn::Vec<hn::Rebind<uint16_t, DF>> h) {
#if FD_NATIVE_F16
  const hn::Rebind<hwy::float16_t, DF> dh;
  return hn::PromoteTo(df, hn::BitCast(dh, h));
#else
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const auto bits = hn::PromoteTo(du, h);
  const auto sign = hn::ShiftLeft<16>(hn::And(bits, hn::Set(du, 0x8000u)));
  const auto exp = hn::ShiftRight<10>(hn::And(bits, hn::Set(du, 0x7C00u)));
  const auto mant = hn::And(bits, hn::Set(du, 0x3FFu));
  // Rebias the exponent by 127 - 15 = 112.
  const auto normal =
      hn::Add(hn::ShiftLeft<13>(hn::And(bits, hn::Set(du, 0x7FFFu))), hn::Set(du, 112u << 23));
  // A subnormal is mant * 2^-24, exact in fp32.
  const auto sub = hn::BitCast(
      du, hn::Mul(hn::ConvertTo(df, hn::BitCast(di, mant)), hn::Set(df, 1.0f / 16777216.0f)));
  const auto quiet = hn::IfThenElseZero(hn::Ne(mant, hn::Zero(du)), hn::Set(du, 0x400000u));
  const auto infnan =
      hn::Or(hn::Or(hn::Set(du, 0x7F800000u), hn::ShiftLeft<13>(mant)), quiet);
  const auto mag = hn::IfThenElse(hn::Eq(exp, hn::Zero(du)), sub,
                                  hn::IfThenElse(hn::Eq(exp, hn::Set(du, 31u)), infnan, normal));
  return hn::BitCast(df, hn::Or(mag, sign));
#endif
}

// Loads Lanes(df) fp16 bit patterns from p and widens them to fp32.
template <class DF>
HWY_INLINE hn::Vec<DF> LoadF16(DF df, const uint16_t* HWY_RESTRICT p) {
  return WidenF16(df, hn::LoadU(hn::Rebind<uint16_t, DF>(), p));
}

// Narrows Lanes(df) floats to fp16 bit patterns and stores them at p.
template <class DF>
HWY_INLINE void StoreF16(DF df, hn::Vec<DF> v, uint16_t* HWY_RESTRICT p) {
#if FD_NATIVE_F16
  const hn::Rebind<hwy::float16_t, DF> dh;
  hn::StoreU(hn::DemoteTo(dh, v), dh, reinterpret_cast<hwy::float16_t*>(p));
#else
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint16_t, DF> du16;
  const auto x = hn::BitCast(du, v);
  const auto sign = hn::And(x, hn::Set(du, 0x80000000u));
  const auto a = hn::Xor(x, sign);  // |v| bits; non-negative as int32, so signed compares work
  const auto ai = hn::BitCast(di, a);
  // |v| >= 65536: infinity, or NaN keeping the top payload bits with the quiet bit set.
  const auto is_big = hn::Gt(ai, hn::Set(di, (143 << 23) - 1));
  const auto is_nan = hn::Gt(ai, hn::Set(di, 0x7F800000));
  const auto nan_bits =
      hn::Or(hn::Set(du, 0x7E00u), hn::And(hn::ShiftRight<13>(a), hn::Set(du, 0x3FFu)));
  const auto big = hn::IfThenElse(hn::RebindMask(du, is_nan), nan_bits, hn::Set(du, 0x7C00u));
  // |v| < 2^-14: adding 0.5f aligns the value to the fp16 subnormal grid, rounding to even.
  const auto is_sub = hn::Lt(ai, hn::Set(di, 113 << 23));
  const auto magic = hn::Set(du, 126u << 23);
  const auto sub = hn::Sub(hn::BitCast(du, hn::Add(hn::BitCast(df, a), hn::BitCast(df, magic))),
                           magic);
  // Normal: rebias the exponent by -112 and round the 13 dropped bits to nearest even.
  const auto odd = hn::And(hn::ShiftRight<13>(a), hn::Set(du, 1u));
  const auto normal = hn::ShiftRight<13>(hn::Add(hn::Add(a, hn::Set(du, 0xC8000FFFu)), odd));
  const auto mag = hn::IfThenElse(hn::RebindMask(du, is_big), big,
                                  hn::IfThenElse(hn::RebindMask(du, is_sub), sub, normal));
  const auto bits = hn::Or(mag, hn::ShiftRight<16>(sign));
  hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di, bits)), du16, p);
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace fd::kernels
HWY_AFTER_NAMESPACE();

#endif  // FD_KERNELS_F16_INL_H_

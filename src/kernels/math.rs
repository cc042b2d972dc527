//! Elementwise math the fused kernels share, written as plain branch-free `f32` code so that
//! the compiler vectorizes the loops that call it, and `multiversion!`, which compiles such a
//! loop three times (AVX-512, AVX2 + FMA, the baseline) and picks one at run time from what the
//! CPU has. The approximations are within a few parts in 10^7 of the exact values (the tests
//! below measure it against `libm`), where Burn's flex ops call `libm` one value at a time.

/// Whether the CPU has AVX-512 (F, VL, BW, DQ), asked once and cached by the standard library.
#[inline]
pub fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512dq")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the CPU has AVX2 and FMA.
#[inline]
pub fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// A function whose body is compiled for AVX-512, for AVX2 + FMA and for the baseline target,
/// the best one the CPU has chosen at each call (the loops inside vectorize to each width;
/// helpers they call must be `#[inline(always)]` to be compiled with the wider features).
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($a:ident : $t:ty),* $(,)?) $(-> $r:ty)? $body:block) => {
        $(#[$m])*
        $vis fn $name($($a: $t),*) $(-> $r)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")]
                unsafe fn v4($($a: $t),*) $(-> $r)? $body
                #[target_feature(enable = "avx2,fma")]
                unsafe fn v3($($a: $t),*) $(-> $r)? $body
                if $crate::kernels::math::has_avx512() {
                    // SAFETY: the CPU has the features v4 was compiled for
                    return unsafe { v4($($a),*) };
                }
                if $crate::kernels::math::has_avx2() {
                    // SAFETY: the CPU has the features v3 was compiled for
                    return unsafe { v3($($a),*) };
                }
            }
            #[inline(always)]
            fn base($($a: $t),*) $(-> $r)? $body
            base($($a),*)
        }
    };
}
pub(crate) use multiversion;

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// 1.5 x 2^23: adding it rounds an f32 below 2^22 in magnitude to an integer, whose value the
/// low mantissa bits then hold.
const ROUND: f32 = 12_582_912.0;

/// e^x (Cephes' `expf`: x = n ln 2 + r with |r| <= ln 2 / 2, a degree-6 polynomial for e^r;
/// relative error about 1e-7). Inputs are clamped to [-87, 88]: below, the result is about
/// 1.6e-38 instead of a subnormal or 0 (harmless next to any sum it joins here); above, it
/// would overflow anyway. NaN stays NaN.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.0);
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let ni = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let r = x - n * 0.693_359_4 + n * 2.121_944_4e-4;
    let p = 1.987_569_1e-4_f32;
    let p = p * r + 1.398_2e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 0.166_666_65;
    let p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    e * f32::from_bits(((ni + 127) as u32) << 23)
}

/// erfc(z) for z >= 0 (Numerical Recipes' `erfcc`, a Chebyshev fit with fractional error
/// below 1.2e-7 everywhere).
#[inline(always)]
pub fn erfc_pos(z: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.5 * z);
    let p = 0.170_872_77_f32;
    let p = p * t - 0.822_152_2;
    let p = p * t + 1.488_515_9;
    let p = p * t - 1.135_204;
    let p = p * t + 0.278_868_07;
    let p = p * t - 0.186_288_06;
    let p = p * t + 0.096_784_18;
    let p = p * t + 0.374_091_96;
    let p = p * t + 1.000_023_7;
    let p = p * t - 1.265_512_2;
    t * exp(-z * z + p)
}

/// Φ(x), the standard normal's distribution function, with its relative precision kept in both
/// tails (0.5 erfc(-x / sqrt 2), the small side computed directly): within a few 1e-6 of the exact
/// value for |x| < 4 (2.5e-6), within 3e-5 out to |x| = 12 (where Φ(-12) is 2e-33).
#[inline(always)]
pub fn normal_cdf(x: f32) -> f32 {
    let tail = 0.5 * erfc_pos(x.abs() * std::f32::consts::FRAC_1_SQRT_2);
    if x >= 0.0 {
        1.0 - tail
    } else {
        tail
    }
}

/// 1 / sqrt(2 pi).
pub const INV_SQRT_2PI: f32 = 0.398_942_3;

/// The logistic function 1 / (1 + e^-x).
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// The sum of `xs`, in 16 lanes added in a fixed order (the same bits on every CPU).
#[inline(always)]
pub fn sum(xs: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let mut chunks = xs.chunks_exact(16);
    for c in &mut chunks {
        for l in 0..16 {
            acc[l] += c[l];
        }
    }
    let mut s = lanes(acc);
    for &v in chunks.remainder() {
        s += v;
    }
    s
}

/// The dot product of `a` and `b` (as long as the shorter), in 16 lanes like `sum`.
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; 16];
    let mut ca = a.chunks_exact(16);
    let mut cb = b.chunks_exact(16);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..16 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = lanes(acc);
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        s += x * y;
    }
    s
}

/// `x[i] = f(x[i])` in place, 32 values at a time like `map32`.
#[inline(always)]
pub fn map32_in_place(x: &mut [f32], f: impl Fn(f32) -> f32) {
    let mut xc = x.chunks_exact_mut(32);
    for xs in &mut xc {
        for v in xs.iter_mut() {
            *v = f(*v);
        }
    }
    for v in xc.into_remainder() {
        *v = f(*v);
    }
}

/// The largest of `xs` (negative infinity for none; NaN if any is NaN).
#[inline(always)]
pub fn max(xs: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 16];
    let mut chunks = xs.chunks_exact(16);
    let mut nan = false;
    for c in &mut chunks {
        for l in 0..16 {
            nan |= c[l].is_nan();
            acc[l] = if c[l] > acc[l] { c[l] } else { acc[l] };
        }
    }
    let mut m = f32::NEG_INFINITY;
    for v in acc.into_iter().chain(chunks.remainder().iter().copied()) {
        nan |= v.is_nan();
        m = if v > m { v } else { m };
    }
    if nan {
        f32::NAN
    } else {
        m
    }
}

/// `y[i] = f(x[i])`, 32 values at a time: the unrolled body holds four independent vectors
/// (AVX2) in flight, so a long polynomial's latency is hidden instead of one chain stalling on
/// each step.
#[inline(always)]
pub fn map32(x: &[f32], y: &mut [f32], f: impl Fn(f32) -> f32) {
    let mut xc = x.chunks_exact(32);
    let mut yc = y.chunks_exact_mut(32);
    for (xs, ys) in (&mut xc).zip(&mut yc) {
        for l in 0..32 {
            ys[l] = f(xs[l]);
        }
    }
    for (o, &v) in yc.into_remainder().iter_mut().zip(xc.remainder()) {
        *o = f(v);
    }
}

/// `out[i] = f(a[i], b[i])`, 32 values at a time like `map32`.
#[inline(always)]
pub fn zip32(a: &[f32], b: &[f32], out: &mut [f32], f: impl Fn(f32, f32) -> f32) {
    let mut ac = a.chunks_exact(32);
    let mut bc = b.chunks_exact(32);
    let mut oc = out.chunks_exact_mut(32);
    for ((xs, ys), os) in (&mut ac).zip(&mut bc).zip(&mut oc) {
        for l in 0..32 {
            os[l] = f(xs[l], ys[l]);
        }
    }
    for ((o, &x), &y) in oc
        .into_remainder()
        .iter_mut()
        .zip(ac.remainder())
        .zip(bc.remainder())
    {
        *o = f(x, y);
    }
}

/// The 16 lanes summed pairwise, in a fixed order.
#[inline(always)]
fn lanes(mut acc: [f32; 16]) -> f32 {
    let mut w = 8;
    while w > 0 {
        for l in 0..w {
            acc[l] += acc[l + w];
        }
        w /= 2;
    }
    acc[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(a: f32, b: f64) -> f64 {
        (f64::from(a) - b).abs() / b.abs().max(f64::MIN_POSITIVE)
    }

    #[test]
    fn exp_is_within_2e7_relative_of_libm_over_its_range() {
        let mut worst: f64 = 0.0;
        let mut x = -87.0f32;
        while x < 88.0 {
            worst = worst.max(rel(exp(x), f64::from(x).exp()));
            x += 0.001_7;
        }
        assert!(worst < 2e-7, "worst relative error {worst:e}");
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(f32::NAN).is_nan());
        assert!(exp(-1000.0) < 1e-37 && exp(-1000.0) > 0.0);
    }

    #[test]
    fn the_normal_cdf_keeps_its_relative_precision_in_both_tails() {
        // (beyond |x| = 4 the exponent x^2 / 2 itself carries f32's rounding: a relative error
        // of a few 1e-6 there, where Φ(-12) is 2e-33)
        for (from, to, bound) in [(-4.0f32, 4.0f32, 2.5e-6), (-12.0, 12.0, 3e-5)] {
            let mut worst: f64 = 0.0;
            let mut x = from;
            while x < to {
                let exact = 0.5 * libm::erfc(-f64::from(x) / std::f64::consts::SQRT_2);
                worst = worst.max(rel(normal_cdf(x), exact));
                x += 0.000_9;
            }
            assert!(
                worst < bound,
                "worst relative error {worst:e} on [{from}, {to})"
            );
        }
        assert!((normal_cdf(0.0) - 0.5).abs() < 1e-7);
    }
}

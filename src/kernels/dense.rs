//! flex tensors as the kernels read and write them: a row-major `f32` view of a tensor (copied
//! only when its layout is not contiguous), new tensors from `Vec<f32>`, gemm with strides (a
//! transposed operand is a pair of strides; `gemm` copies one to rows only where gemm would
//! otherwise gather it value by value, see there), and rows split over the rank's
//! threads in chunks whose size depends on the shape only, so that every sum across rows is
//! added in the same order whatever the thread count (bit-equal runs, exact resume).

use burn::tensor::{Shape, TensorData};
use burn_flex::FlexTensor;
use rayon::prelude::*;

/// `t` with a row-major layout (itself when it has one, a copy otherwise).
pub fn contiguous(t: FlexTensor) -> FlexTensor {
    if t.layout().is_contiguous() {
        t
    } else {
        t.to_contiguous()
    }
}

/// The values of a contiguous `t` in row-major order (see `contiguous`).
pub fn values(t: &FlexTensor) -> &[f32] {
    let start = t.layout().start_offset();
    &t.storage::<f32>()[start..start + t.layout().num_elements()]
}

/// A tensor of `shape` holding `v`.
pub fn tensor(v: Vec<f32>, shape: &[usize]) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(v, Shape::from(shape.to_vec())))
}

/// The dims of `t`.
pub fn dims(t: &FlexTensor) -> Vec<usize> {
    t.layout().shape().to_vec()
}

/// A zeroed buffer of `n` values.
pub fn zeros(n: usize) -> Vec<f32> {
    vec![0.0; n]
}

/// A buffer of `n` values for an output that its kernel writes in full before anything reads
/// it (a gemm that does not accumulate, an elementwise map): not cleared first, which cost the
/// baby GPT's step 5% of its time in `memset`.
// clippy's uninit_vec: deliberate, for the reason above; no caller reads before it writes
#[allow(clippy::uninit_vec)]
pub fn for_output(n: usize) -> Vec<f32> {
    let mut v = Vec::<f32>::with_capacity(n);
    // SAFETY: every `f32` bit pattern is a valid value, and each caller writes every value
    // (gemm with `accumulate` false never reads its destination) before any is read
    unsafe { v.set_len(n) };
    v
}

/// Multiply-adds above which gemm splits one product over the rank's threads (below it the
/// split costs more than it saves).
const PARALLEL_GEMM: usize = 1 << 21;

/// A matrix operand: its first element and the strides between rows and between columns.
#[derive(Clone, Copy)]
pub struct Mat {
    pub ptr: *const f32,
    pub rs: isize,
    pub cs: isize,
}

impl Mat {
    /// Row-major `[rows, cols]` at `v` (row stride `cols`).
    pub fn rows(v: &[f32], cols: usize) -> Mat {
        Mat {
            ptr: v.as_ptr(),
            rs: cols as isize,
            cs: 1,
        }
    }
    /// Its transpose (strides swapped: no copy).
    pub fn t(self) -> Mat {
        Mat {
            ptr: self.ptr,
            rs: self.cs,
            cs: self.rs,
        }
    }
    /// The operand starting `by` elements further.
    pub fn at(self, by: usize) -> Mat {
        Mat {
            // SAFETY (of the caller's use): offsets stay inside the operand's buffer
            ptr: self.ptr.wrapping_add(by),
            ..self
        }
    }
}

/// A destination matrix: first element and strides.
#[derive(Clone, Copy)]
pub struct MatMut {
    pub ptr: *mut f32,
    pub rs: isize,
    pub cs: isize,
}

impl MatMut {
    /// Row-major `[rows, cols]` at `v`.
    pub fn rows(v: &mut [f32], cols: usize) -> MatMut {
        MatMut {
            ptr: v.as_mut_ptr(),
            rs: cols as isize,
            cs: 1,
        }
    }
    /// The destination starting `by` elements further.
    pub fn at(self, by: usize) -> MatMut {
        MatMut {
            ptr: self.ptr.wrapping_add(by),
            ..self
        }
    }
}

/// What `gemm` computes: `dst [m, n] = (accumulate ? dst : 0) + scale * lhs [m, k] * rhs
/// [k, n]`.
#[derive(Clone, Copy, Debug)]
pub struct Product {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// Add to `dst` (true) or overwrite it (false: `dst` is never read).
    pub accumulate: bool,
    pub scale: f32,
}

/// `dst [m, n] = (accumulate ? dst : 0) + scale * lhs [m, k] * rhs [k, n]`, split over the
/// rank's threads when `threads` and the product is large enough.
///
/// # Safety
/// Every operand must be valid for its `m`, `n`, `k` and strides, and `dst` must not overlap
/// an operand or be written by anyone else meanwhile.
pub unsafe fn gemm(product: Product, dst: MatMut, lhs: Mat, rhs: Mat, threads: bool) {
    let Product {
        m,
        n,
        k,
        accumulate,
        ..
    } = product;
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                for j in 0..n {
                    // SAFETY: inside dst (the caller's contract)
                    unsafe { *dst.ptr.offset(i as isize * dst.rs + j as isize * dst.cs) = 0.0 };
                }
            }
        }
        return;
    }
    // gemm multiplies a row-major dst as its transpose, packing rhsᵀ by columns: a rhs read
    // down its columns (a transposed weight) is gathered one value at a time, by every
    // thread; copied to rows once here, it is packed with vector copies. Not for few rows
    // (decoding: gemm then reads the operand once, in a kernel of its own), nor for a rhs
    // whose copy would hold much memory (a large vocabulary's tied head)
    if dst.cs == 1
        && rhs.rs == 1
        && rhs.cs > 1
        && m >= COPY_ROWS
        && n >= 16
        && (COPY_RHS..=COPY_RHS_MAX).contains(&(n * k))
    {
        with_scratch(n * k, |rows| {
            // SAFETY: rhs is [k, n] through its strides (the caller's contract): rhsᵀ is
            // [n, k] row-major with row stride rhs.cs; then the caller's contract, rhs in rows
            unsafe {
                transpose(rhs.ptr, rhs.cs as usize, n, k, rows);
                gemm(product, dst, lhs, Mat::rows(rows, n), threads)
            }
        });
        return;
    }
    let parts = if threads && m * n * k >= PARALLEL_GEMM {
        rayon::current_num_threads().min(m.max(n) / 16).max(1)
    } else {
        1
    };
    if parts == 1 {
        // SAFETY: the caller's contract
        unsafe { gemm_one(product, dst, lhs, rhs) };
        return;
    }
    // one block of rows (or of columns, when there are more of them) per thread, each a gemm
    // of its own: no synchronisation inside the product, and every value of dst is summed over
    // k in the same order as in one gemm
    let by_rows = m >= n;
    let total = if by_rows { m } else { n };
    let step = total.div_ceil(parts);
    let (d, l, r) = (SendMat(dst.ptr), lhs, rhs);
    let (l, r) = (SendConst(l.ptr, l.rs, l.cs), SendConst(r.ptr, r.rs, r.cs));
    let (drs, dcs) = (dst.rs, dst.cs);
    (0..parts).into_par_iter().for_each(move |p| {
        let (from, to) = (p * step, ((p + 1) * step).min(total));
        if from >= to {
            return;
        }
        let (l, r, d) = (l.mat(), r.mat(), d.mat(drs, dcs));
        // SAFETY: the caller's contract; each part writes its own rows (or columns) of dst
        unsafe {
            if by_rows {
                let off = from as isize;
                let dst = MatMut {
                    ptr: d.ptr.offset(off * drs),
                    ..d
                };
                let lhs = Mat {
                    ptr: l.ptr.offset(off * l.rs),
                    ..l
                };
                gemm_one(
                    Product {
                        m: to - from,
                        ..product
                    },
                    dst,
                    lhs,
                    r,
                );
            } else {
                let off = from as isize;
                let dst = MatMut {
                    ptr: d.ptr.offset(off * dcs),
                    ..d
                };
                let rhs = Mat {
                    ptr: r.ptr.offset(off * r.cs),
                    ..r
                };
                gemm_one(
                    Product {
                        n: to - from,
                        ..product
                    },
                    dst,
                    l,
                    rhs,
                );
            }
        }
    });
}

/// The values (from, to) of a column-read rhs that `gemm` copies to rows first, and the rows
/// of the product it needs to: below, gemm's packing costs little; above, the copy would hold
/// 16 MiB more while it runs.
const COPY_RHS: usize = 4096;
const COPY_RHS_MAX: usize = 1 << 22;
const COPY_ROWS: usize = 64;

/// The most values `with_scratch` keeps on a thread (256 KiB): a larger buffer is allocated
/// for its call (the allocator keeps blocks of a size that comes back, see `kiln::memory`).
const SCRATCH_KEPT: usize = 1 << 16;

thread_local! {
    /// This thread's buffer for `with_scratch`, kept between calls (the attention asks for
    /// one per head, layer and step).
    static SCRATCH: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// `f` on a buffer of `n` values whose contents are unspecified (`f` must write a value before
/// it reads it), kept by this thread between calls up to `SCRATCH_KEPT` values. Taken while
/// `f` runs, so a call made meanwhile on this thread (nested, or a task rayon's work stealing
/// runs here) uses a buffer of its own.
pub fn with_scratch<R>(n: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    if n == 0 {
        // the kept buffer stays for a call `f` makes
        return f(&mut []);
    }
    if n > SCRATCH_KEPT {
        return f(&mut for_output(n));
    }
    let mut v = SCRATCH.take();
    if v.len() < n {
        v = for_output(n);
    }
    let r = f(&mut v[..n]);
    SCRATCH.set(v);
    r
}

/// `dst` (`[cols, rows]` row-major) = the transpose of `src` (`[rows, cols]`, row stride
/// `stride`), by 8 x 8 tiles (AVX shuffles where the CPU has AVX2).
///
/// # Safety
/// `src` must be valid for `rows` rows of `cols` values `stride` apart; `dst` holds
/// `rows * cols` values.
pub unsafe fn transpose(src: *const f32, stride: usize, rows: usize, cols: usize, dst: &mut [f32]) {
    assert!(dst.len() >= rows * cols);
    let d = dst.as_mut_ptr();
    let (r8, c8) = (rows / 8 * 8, cols / 8 * 8);
    #[cfg(target_arch = "x86_64")]
    let tiles = super::math::has_avx2();
    #[cfg(not(target_arch = "x86_64"))]
    let tiles = false;
    // SAFETY (all): indices inside src's rows x cols and dst's cols x rows (the contract)
    unsafe {
        #[cfg(target_arch = "x86_64")]
        if tiles {
            for r in (0..r8).step_by(8) {
                for c in (0..c8).step_by(8) {
                    tile8(src.add(r * stride + c), stride, d.add(c * rows + r), rows);
                }
            }
        }
        let scalar = |r0: usize, r1: usize, c0: usize, c1: usize| {
            for r in r0..r1 {
                for c in c0..c1 {
                    *d.add(c * rows + r) = *src.add(r * stride + c);
                }
            }
        };
        if tiles {
            scalar(0, r8, c8, cols);
            scalar(r8, rows, 0, cols);
        } else {
            for r in (0..rows).step_by(8) {
                for c in (0..cols).step_by(8) {
                    scalar(r, (r + 8).min(rows), c, (c + 8).min(cols));
                }
            }
        }
    }
}

/// One 8 x 8 tile of `transpose`: rows `s`, `s + ss`, ... into rows `d`, `d + ds`, ...
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn tile8(s: *const f32, ss: usize, d: *mut f32, ds: usize) {
    use std::arch::x86_64::*;
    // SAFETY: 8 rows of 8 values at s and d (the caller's contract)
    unsafe {
        let r = |i: usize| _mm256_loadu_ps(s.add(i * ss));
        let (r0, r1, r2, r3, r4, r5, r6, r7) = (r(0), r(1), r(2), r(3), r(4), r(5), r(6), r(7));
        let (t0, t1) = (_mm256_unpacklo_ps(r0, r1), _mm256_unpackhi_ps(r0, r1));
        let (t2, t3) = (_mm256_unpacklo_ps(r2, r3), _mm256_unpackhi_ps(r2, r3));
        let (t4, t5) = (_mm256_unpacklo_ps(r4, r5), _mm256_unpackhi_ps(r4, r5));
        let (t6, t7) = (_mm256_unpacklo_ps(r6, r7), _mm256_unpackhi_ps(r6, r7));
        // the low and the high pairs of each 4-value half of a and b
        let pairs = |a, b| {
            (
                _mm256_shuffle_ps::<0x44>(a, b),
                _mm256_shuffle_ps::<0xEE>(a, b),
            )
        };
        let ((u0, u1), (u2, u3)) = (pairs(t0, t2), pairs(t1, t3));
        let ((u4, u5), (u6, u7)) = (pairs(t4, t6), pairs(t5, t7));
        let w = |i: usize, v: __m256| _mm256_storeu_ps(d.add(i * ds), v);
        w(0, _mm256_permute2f128_ps::<0x20>(u0, u4));
        w(1, _mm256_permute2f128_ps::<0x20>(u1, u5));
        w(2, _mm256_permute2f128_ps::<0x20>(u2, u6));
        w(3, _mm256_permute2f128_ps::<0x20>(u3, u7));
        w(4, _mm256_permute2f128_ps::<0x31>(u0, u4));
        w(5, _mm256_permute2f128_ps::<0x31>(u1, u5));
        w(6, _mm256_permute2f128_ps::<0x31>(u2, u6));
        w(7, _mm256_permute2f128_ps::<0x31>(u3, u7));
    }
}

/// A destination pointer sent to the threads of `gemm` (each writes its own part).
#[derive(Clone, Copy)]
struct SendMat(*mut f32);
// SAFETY: the parts written through it are disjoint, and `gemm` joins before returning
unsafe impl Send for SendMat {}
// SAFETY: as above
unsafe impl Sync for SendMat {}
impl SendMat {
    fn mat(self, rs: isize, cs: isize) -> MatMut {
        MatMut {
            ptr: self.0,
            rs,
            cs,
        }
    }
}

/// An operand pointer and its strides, read by the threads of `gemm`.
#[derive(Clone, Copy)]
struct SendConst(*const f32, isize, isize);
// SAFETY: only read while `gemm` runs, which joins before returning
unsafe impl Send for SendConst {}
// SAFETY: as above
unsafe impl Sync for SendConst {}
impl SendConst {
    fn mat(self) -> Mat {
        Mat {
            ptr: self.0,
            rs: self.1,
            cs: self.2,
        }
    }
}

/// One gemm on this thread.
///
/// # Safety
/// As `gemm`.
unsafe fn gemm_one(product: Product, dst: MatMut, lhs: Mat, rhs: Mat) {
    let Product {
        m,
        n,
        k,
        accumulate,
        scale,
    } = product;
    // SAFETY: the caller's contract
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.ptr,
            dst.cs,
            dst.rs,
            accumulate,
            lhs.ptr,
            lhs.cs,
            lhs.rs,
            rhs.ptr,
            rhs.cs,
            rhs.rs,
            1.0,
            scale,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// A pointer that tasks on other threads write through, each to its own disjoint part.
#[derive(Clone, Copy)]
pub struct Shared(pub *mut f32);
impl Shared {
    /// The pointer (a method, so that a closure captures the whole `Shared`, not its field).
    pub fn ptr(self) -> *mut f32 {
        self.0
    }
}

// SAFETY: every user writes disjoint ranges and joins before the buffer is read
unsafe impl Send for Shared {}
// SAFETY: as above
unsafe impl Sync for Shared {}

/// Rows per chunk of work for rows of `cols` values: about 16 Ki values per chunk (a function
/// of the shape only, never of the thread count).
pub fn chunk_rows(cols: usize) -> usize {
    (16_384 / cols.max(1)).max(1)
}

/// Runs `f(first_row, chunk)` over chunks of `out` (rows of `cols` values), on the rank's
/// threads when there are several chunks.
pub fn for_rows(out: &mut [f32], cols: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    let rows = chunk_rows(cols);
    let len = rows * cols.max(1);
    if out.len() <= len {
        f(0, out);
        return;
    }
    out.par_chunks_mut(len)
        .enumerate()
        .for_each(|(i, c)| f(i * rows, c));
}

/// Like `for_rows` over two outputs of `a_cols` and `b_cols` values per row.
pub fn for_rows2(
    a: &mut [f32],
    a_cols: usize,
    b: &mut [f32],
    b_cols: usize,
    f: impl Fn(usize, &mut [f32], &mut [f32]) + Sync + Send,
) {
    let rows = chunk_rows(a_cols.max(b_cols));
    let (la, lb) = (rows * a_cols, rows * b_cols);
    if a.len() <= la {
        f(0, a, b);
        return;
    }
    a.par_chunks_mut(la.max(1))
        .zip(b.par_chunks_mut(lb.max(1)))
        .enumerate()
        .for_each(|(i, (x, y))| f(i * rows, x, y));
}

/// Sums over rows: each chunk of rows (of `cols` values) gives `f(first_row, rows, partial)`
/// a zeroed partial of `width` values to add into; the partials are then added in chunk order,
/// so the result does not depend on the thread count.
pub fn sum_rows(
    rows: usize,
    cols: usize,
    width: usize,
    f: impl Fn(usize, usize, &mut [f32]) + Sync + Send,
) -> Vec<f32> {
    let per = chunk_rows(cols);
    let chunks = rows.div_ceil(per).max(1);
    let mut partials = zeros(chunks * width);
    if chunks == 1 {
        f(0, rows, &mut partials);
        return partials;
    }
    partials
        .par_chunks_mut(width.max(1))
        .enumerate()
        .for_each(|(c, p)| {
            let first = c * per;
            f(first, per.min(rows - first), p)
        });
    let (total, rest) = partials.split_at_mut(width);
    for p in rest.chunks(width) {
        for (t, v) in total.iter_mut().zip(p) {
            *t += v;
        }
    }
    partials.truncate(width);
    partials
}

/// `sum_rows` over the rows of `out` (rows of `cols` values) that also hands each chunk its
/// own rows of `out` to write: `f(first_row, rows, out_rows, partial)` (a backward's input
/// gradient beside its parameters' sums).
pub fn sum_rows_writing(
    out: &mut [f32],
    cols: usize,
    width: usize,
    f: impl Fn(usize, usize, &mut [f32], &mut [f32]) + Sync + Send,
) -> Vec<f32> {
    let rows = out.len() / cols.max(1);
    let at = Shared(out.as_mut_ptr());
    sum_rows(rows, cols, width, |first, n, partial| {
        let (a, b) = (first * cols, (first + n) * cols);
        // SAFETY: sum_rows's chunks of rows are disjoint, and `out` outlives the call
        let chunk = unsafe { std::slice::from_raw_parts_mut(at.ptr().add(a), b - a) };
        f(first, n, chunk, partial)
    })
}

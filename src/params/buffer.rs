//! Flat buffers of parameters and gradients, on the host or owned by a backend on a device.
//!
//! `DeviceTensor` is a flat buffer a backend owns (implemented once, generically, by
//! `DeviceFlat<B>`; the backend supplies how to reach the raw pointer, which collectives such as
//! NCCL work on). `Grads` is a step's accumulated gradient, on the host or on the device.

use std::any::Any;
use std::ops::Range;

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData};

use super::device::{BurnParams, DeviceParams};
use super::optim::Optimizer;
use super::transfers::{record, Moved};

/// Element type of a device buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DevDType {
    F32,
    F16,
    Bf16,
}

impl DevDType {
    pub fn size(self) -> usize {
        match self {
            DevDType::F32 => 4,
            DevDType::F16 | DevDType::Bf16 => 2,
        }
    }
}

/// `len` elements of `dtype` at device address `ptr`; valid while the `DeviceTensor` it came from
/// is alive and unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawBuf {
    pub ptr: u64,
    pub len: usize,
    pub dtype: DevDType,
}

impl RawBuf {
    /// Elements `range` of this buffer.
    pub fn slice(&self, range: Range<usize>) -> RawBuf {
        debug_assert!(range.end <= self.len);
        RawBuf {
            ptr: self.ptr + (range.start * self.dtype.size()) as u64,
            len: range.len(),
            dtype: self.dtype,
        }
    }
}

/// A flat buffer owned by a backend.
pub trait DeviceTensor {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The buffer, after every pending write to it has finished.
    fn raw(&mut self) -> Result<RawBuf, String>;
    /// A new zeroed buffer of `len` elements on the same device.
    fn zeros(&self, len: usize) -> Result<Box<dyn DeviceTensor>, String>;
    /// A new buffer on the same device holding `values`.
    fn upload(&self, values: &[f32]) -> Result<Box<dyn DeviceTensor>, String>;
    /// Elements `range` (for reading; may share this buffer).
    fn slice(&self, range: Range<usize>) -> Box<dyn DeviceTensor>;
    /// A new buffer: elements `range` of this one, then zeros up to `padded` elements.
    fn padded(&self, range: Range<usize>, padded: usize) -> Result<Box<dyn DeviceTensor>, String>;
    /// The values as f32 on the host.
    fn to_host(&mut self) -> Result<Vec<f32>, String>;
    /// The sum of the squared values (one reduction on the device, one scalar read back).
    fn sum_squares(&self) -> Result<f64, String>;
    /// Whether any value is NaN or infinite (one reduction on the device, one flag read back).
    fn non_finite(&self) -> Result<bool, String>;
    /// Writes `values` over elements `offset..offset + values.len()` (a host-staged
    /// collective's result coming back).
    fn write_at(&mut self, offset: usize, values: &[f32]) -> Result<(), String>;
    /// Adds `other` (a buffer of the same kind) into elements `offset..offset + other.len()`.
    fn add_at(&mut self, offset: usize, other: &mut dyn DeviceTensor) -> Result<(), String>;
    /// Writes `other` (a buffer of the same kind) over elements `offset..offset + other.len()`
    /// (a reduction that ran beside the compute, coming back).
    fn set_at(&mut self, offset: usize, other: &mut dyn DeviceTensor) -> Result<(), String>;
    fn as_any_mut(&mut self) -> &mut dyn Any;
    /// `params` and the state of `opt` moved to this buffer's device, to stay there between
    /// steps; `None` for a buffer that is not f32 (the masters are f32 whatever the compute
    /// dtype, so kiln's own buffers always are). The first `frozen` elements never train
    /// (`ParamLayout::frozen`): `opt` steps the rest, with gradients of the rest's length.
    fn device_params(
        &self,
        params: &[f32],
        frozen: usize,
        opt: &Optimizer,
    ) -> Option<Box<dyn DeviceParams>>;
}

/// How a backend reaches the device address of a flat tensor (pending work finished). The second
/// value keeps whatever guards the address alive until the op is done.
pub type RawFn<B> = fn(&Tensor<B, 1>) -> Result<(RawBuf, Box<dyn Any>), String>;

/// The `RawFn` of a device backend whose buffers a device collective cannot address (wgpu):
/// its collectives are host-staged.
pub fn no_address<B: Backend>(_: &Tensor<B, 1>) -> Result<(RawBuf, Box<dyn Any>), String> {
    Err("this backend's buffers have no device address (NCCL needs CUDA buffers)".into())
}

/// The Burn float dtype of a `backend.precision` or `strategy.reduce_dtype`.
pub fn float_dtype(p: crate::config::Precision) -> burn::tensor::FloatDType {
    use crate::config::Precision;
    use burn::tensor::FloatDType;
    match p {
        Precision::F32 => FloatDType::F32,
        Precision::Bf16 => FloatDType::BF16,
        Precision::F16 => FloatDType::F16,
    }
}

/// `len` zeros in f32 on `device`. Master buffers (parameters, gradients, optimizer state, the
/// buffers collectives write) are f32 whatever the compute dtype (`backend.precision`, the
/// device's default float dtype): they are always made with this and `master_upload`.
pub fn master_zeros<B: Backend>(len: usize, device: &B::Device) -> Tensor<B, 1> {
    Tensor::zeros([len], (device, DType::F32))
}

/// `values` in f32 on `device` (see `master_zeros`).
pub fn master_upload<B: Backend>(values: &[f32], device: &B::Device) -> Tensor<B, 1> {
    Tensor::from_data(
        TensorData::new(values.to_vec(), [values.len()]),
        (device, DType::F32),
    )
}

/// A flat Burn tensor on a device backend (its raw address, where it has one, for NCCL).
pub struct DeviceFlat<B: Backend> {
    pub tensor: Tensor<B, 1>,
    raw_fn: RawFn<B>,
    guard: Option<Box<dyn Any>>,
}

impl<B: Backend> DeviceFlat<B> {
    pub fn new(tensor: Tensor<B, 1>, raw_fn: RawFn<B>) -> Self {
        DeviceFlat {
            tensor,
            raw_fn,
            guard: None,
        }
    }
    fn wrap(&self, tensor: Tensor<B, 1>) -> Box<dyn DeviceTensor> {
        Box::new(DeviceFlat::new(tensor, self.raw_fn))
    }
    /// Adds `other` (same length) into this buffer.
    pub fn add(&mut self, other: Tensor<B, 1>) {
        self.guard = None;
        self.tensor = self.tensor.clone() + other;
    }
    /// Adds `other` into elements `offset..offset + other.len()` of this buffer.
    pub fn add_at(&mut self, offset: usize, other: Tensor<B, 1>) {
        let len = other.dims()[0];
        if offset == 0 && len == self.len() {
            return self.add(other);
        }
        self.guard = None;
        let range = offset..offset + len;
        // the only handle on the buffer while it is written, so the backend can do it in place
        let device = self.tensor.device();
        let t = std::mem::replace(&mut self.tensor, master_zeros(0, &device));
        let sum = t.clone().slice([range.clone()]) + other;
        self.tensor = t.slice_assign([range], sum);
    }
}

impl<B: Backend> DeviceTensor for DeviceFlat<B> {
    fn len(&self) -> usize {
        self.tensor.dims()[0]
    }
    fn raw(&mut self) -> Result<RawBuf, String> {
        let (raw, guard) = (self.raw_fn)(&self.tensor)?;
        self.guard = Some(guard);
        Ok(raw)
    }
    fn zeros(&self, len: usize) -> Result<Box<dyn DeviceTensor>, String> {
        Ok(self.wrap(master_zeros(len, &self.tensor.device())))
    }
    fn upload(&self, values: &[f32]) -> Result<Box<dyn DeviceTensor>, String> {
        Ok(self.wrap(master_upload(values, &self.tensor.device())))
    }
    fn slice(&self, range: Range<usize>) -> Box<dyn DeviceTensor> {
        self.wrap(self.tensor.clone().slice([range]))
    }
    fn padded(&self, range: Range<usize>, padded: usize) -> Result<Box<dyn DeviceTensor>, String> {
        let device = self.tensor.device();
        let part = self.tensor.clone().slice([range.clone()]);
        let t = if padded > range.len() {
            Tensor::cat(vec![part, master_zeros(padded - range.len(), &device)], 0)
        } else {
            // a copy, never a view: the collective writes its own buffers
            part.mul_scalar(1.0)
        };
        Ok(self.wrap(t))
    }
    fn to_host(&mut self) -> Result<Vec<f32>, String> {
        self.guard = None;
        self.tensor
            .clone()
            .into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .map_err(|e| format!("reading a device buffer: {e:?}"))
    }
    fn sum_squares(&self) -> Result<f64, String> {
        Ok(chunked_sum(&self.tensor, |t| t.clone().mul(t)))
    }
    fn non_finite(&self) -> Result<bool, String> {
        // x * 0 is 0 for every finite x and NaN for NaN and the infinities: float sums, one
        // scalar read (no bool tensor)
        let s = chunked_sum(&self.tensor, |t| t.mul_scalar(0.0));
        Ok(!s.is_finite())
    }
    fn write_at(&mut self, offset: usize, values: &[f32]) -> Result<(), String> {
        self.guard = None;
        let device = self.tensor.device();
        let range = offset..offset + values.len();
        let part = master_upload::<B>(values, &device);
        // the only handle on the buffer while it is written, so the backend can do it in place
        let t = std::mem::replace(&mut self.tensor, master_zeros(0, &device));
        self.tensor = t.slice_assign([range], part);
        Ok(())
    }
    fn add_at(&mut self, offset: usize, other: &mut dyn DeviceTensor) -> Result<(), String> {
        let other = other
            .as_any_mut()
            .downcast_mut::<DeviceFlat<B>>()
            .ok_or("a device buffer of another backend")?;
        DeviceFlat::add_at(self, offset, other.tensor.clone());
        Ok(())
    }
    fn set_at(&mut self, offset: usize, other: &mut dyn DeviceTensor) -> Result<(), String> {
        let part = other
            .as_any_mut()
            .downcast_mut::<DeviceFlat<B>>()
            .ok_or("a device buffer of another backend")?
            .tensor
            .clone();
        self.guard = None;
        let device = self.tensor.device();
        let range = offset..offset + part.dims()[0];
        // the only handle on the buffer while it is written, so the backend can do it in place
        let t = std::mem::replace(&mut self.tensor, master_zeros(0, &device));
        self.tensor = t.slice_assign([range], part);
        Ok(())
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn device_params(
        &self,
        params: &[f32],
        frozen: usize,
        opt: &Optimizer,
    ) -> Option<Box<dyn DeviceParams>> {
        (self.tensor.dtype() == DType::F32).then(|| {
            Box::new(BurnParams::<B>::new(
                params,
                frozen,
                opt,
                &self.tensor.device(),
                self.raw_fn,
            )) as Box<dyn DeviceParams>
        })
    }
}

/// Elements per reduction in `chunked_sum`.
const REDUCE_CHUNK: usize = 1 << 15;

/// The sum of `f(t)`, reduced in slices of at most `REDUCE_CHUNK` elements whose sums are
/// summed the same way, read back as one scalar. Burn 0.21's wgpu reductions covered only the
/// first 131,072 elements of a 421,642-element tensor on lavapipe (a finite gradient then read
/// as non-finite, a NaN past them went unseen, clipping norms came out short); reductions of
/// this size are exact there, and cost a few more launches elsewhere.
fn chunked_sum<B: Backend>(t: &Tensor<B, 1>, f: impl Fn(Tensor<B, 1>) -> Tensor<B, 1>) -> f64 {
    use burn::tensor::ElementConversion;
    let n = t.dims()[0];
    if n <= REDUCE_CHUNK {
        return f(t.clone()).sum().into_scalar().elem();
    }
    let mut parts: Vec<Tensor<B, 1>> = (0..n)
        .step_by(REDUCE_CHUNK)
        .map(|s| f(t.clone().slice(s..(s + REDUCE_CHUNK).min(n))).sum())
        .collect();
    while parts.len() > REDUCE_CHUNK {
        parts = parts
            .chunks(REDUCE_CHUNK)
            .map(|c| Tensor::cat(c.to_vec(), 0).sum())
            .collect();
    }
    Tensor::cat(parts, 0).sum().into_scalar().elem()
}

/// Elements `range` of a device gradient read to the host (a host-staged collective, a host
/// update), counted as such.
pub fn grads_to_host(d: &dyn DeviceTensor, range: Range<usize>) -> Result<Vec<f32>, String> {
    let v = d.slice(range).to_host()?;
    record(Moved::GradsToHost, v.len());
    Ok(v)
}

/// A step's accumulated gradient: flat, in the model's layout.
pub enum Grads {
    Host(Vec<f32>),
    Device(Box<dyn DeviceTensor>),
}

impl Grads {
    pub fn len(&self) -> usize {
        match self {
            Grads::Host(v) => v.len(),
            Grads::Device(d) => d.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Whether any value is NaN or infinite.
    pub fn non_finite(&self) -> Result<bool, String> {
        match self {
            Grads::Host(v) => Ok(!all_finite(v)),
            Grads::Device(d) => d.non_finite(),
        }
    }
    /// Adds `other` into elements `offset..offset + other.len()` (both on the host, or both
    /// device buffers of one backend).
    pub fn add_at(&mut self, offset: usize, other: Grads) -> Result<(), String> {
        match (self, other) {
            (Grads::Host(a), other) => {
                let b = other.to_host_vec()?;
                crate::kernels::add_into(&mut a[offset..offset + b.len()], &b);
                Ok(())
            }
            (Grads::Device(a), Grads::Device(mut b)) => a.add_at(offset, b.as_mut()),
            (Grads::Device(a), Grads::Host(b)) => {
                record(Moved::GradsToDevice, b.len());
                let mut up = a.upload(&b)?;
                a.add_at(offset, up.as_mut())
            }
        }
    }
    /// A zeroed gradient of `len` elements where `like` is (host, or its device).
    pub fn zeros_like(like: &Grads, len: usize) -> Result<Grads, String> {
        match like {
            Grads::Host(_) => Ok(Grads::Host(vec![0.0; len])),
            Grads::Device(d) => Ok(Grads::Device(d.zeros(len)?)),
        }
    }
    /// The gradient on the host (copied from the device when it is there).
    pub fn to_host_vec(self) -> Result<Vec<f32>, String> {
        match self {
            Grads::Host(v) => Ok(v),
            Grads::Device(mut d) => {
                record(Moved::GradsToHost, d.len());
                d.to_host()
            }
        }
    }
}

/// Whether every value is finite: a branch-free scan in blocks over the rank's threads (the
/// compiler vectorises the inner fold), stopping early at a block with a NaN or an infinity.
pub fn all_finite(values: &[f32]) -> bool {
    crate::kernels::all_finite(values)
}

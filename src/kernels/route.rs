//! Which implementation a tensor of backend `B` gets: the fused one when `B` is flex (with or
//! without autodiff) and the tensor is f32, Burn's ops otherwise. A model is generic over its
//! backend, so the kernels recognise flex by its `TypeId` and move tensor primitives in and
//! out of the concrete types by a cast that only happens between equal types (nothing is
//! copied).

use std::any::TypeId;
use std::mem::ManuallyDrop;

use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::{Backend, BackendTypes};
use burn::tensor::{DType, Tensor, TensorPrimitive};
use burn_flex::FlexTensor;

/// flex with autodiff (what kiln trains with).
pub type AdFlex = Autodiff<Flex>;
/// Its tensor primitive: a flex tensor with its node in the autodiff graph.
pub type AdTensor = <AdFlex as BackendTypes>::FloatTensorPrimitive;

/// `t` as a `U` when `T` is `U`, else `t` back.
fn cast<T: 'static, U: 'static>(t: T) -> Result<U, T> {
    if TypeId::of::<T>() == TypeId::of::<U>() {
        let t = ManuallyDrop::new(t);
        // SAFETY: `T` and `U` are the same type, and `t` is not dropped (it moves into the copy)
        Ok(unsafe { std::mem::transmute_copy::<T, U>(&t) })
    } else {
        Err(t)
    }
}

/// Whether the fused kernels run on backend `B` for tensors of `dtype`.
pub fn fused_on<B: Backend>(dtype: DType) -> bool {
    dtype == DType::F32
        && (TypeId::of::<B>() == TypeId::of::<AdFlex>()
            || TypeId::of::<B>() == TypeId::of::<Flex>())
}

/// Tensors of one backend in their concrete flex form.
pub enum Routes<const N: usize> {
    /// flex with autodiff: the kernel records its own backward.
    Autodiff([AdTensor; N]),
    /// flex without autodiff (evaluation, sampling).
    Plain([FlexTensor; N]),
}

/// `ts` in their concrete flex form, or back unchanged when `B` is not flex or one of them is
/// not f32.
pub fn route<B: Backend, const N: usize, const D: usize>(
    ts: [Tensor<B, D>; N],
) -> Result<Routes<N>, [Tensor<B, D>; N]> {
    if !ts.iter().all(|t| fused_on::<B>(t.dtype())) {
        return Err(ts);
    }
    let prims = ts.map(|t| t.into_primitive().tensor());
    let back = |p: [B::FloatTensorPrimitive; N]| {
        p.map(|p| Tensor::from_primitive(TensorPrimitive::Float(p)))
    };
    match cast::<_, [AdTensor; N]>(prims) {
        Ok(a) => Ok(Routes::Autodiff(a)),
        Err(prims) => match cast::<_, [FlexTensor; N]>(prims) {
            Ok(f) => Ok(Routes::Plain(f)),
            Err(prims) => Err(back(prims)),
        },
    }
}

/// One tensor's `route`.
pub fn route1<B: Backend, const D: usize>(t: Tensor<B, D>) -> Result<Routes<1>, Tensor<B, D>> {
    route([t]).map_err(|[t]| t)
}

/// A kernel's output back as a `Tensor<B, D>`: `t` is `B`'s primitive (the kernel was routed
/// there by `route`), so the cast holds; `None` only if it were not.
pub fn back<B: Backend, T: 'static, const D: usize>(t: T) -> Option<Tensor<B, D>> {
    cast::<T, B::FloatTensorPrimitive>(t)
        .ok()
        .map(|p| Tensor::from_primitive(TensorPrimitive::Float(p)))
}

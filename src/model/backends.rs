//! The one list of backends kiln computes on. Adding a backend is one entry here (and, when its
//! ranks need more than a default device, its `backend::RankBackend` impl): the list expands
//! into `backend::Resolved` and its names, the dispatch of a run and of an evaluation to the
//! backend's type, and every model's compute on it.
//!
//! `for_each_backend!(m)` calls macro `m` once with every entry, each as
//! `#[cfg(..)] Variant = "name" => BurnAutodiffType`, comma-separated.

macro_rules! for_each_backend {
    ($m:ident) => {
        $m! {
            #[cfg(all())]
            Ndarray = "ndarray" => ::burn::backend::Autodiff<::burn::backend::NdArray>,
            #[cfg(all())]
            Flex = "flex" => ::burn::backend::Autodiff<::burn::backend::Flex>,
            #[cfg(feature = "cuda")]
            CudaF32 = "cuda-f32" => ::burn::backend::Autodiff<::burn::backend::Cuda<f32>>,
            #[cfg(feature = "cuda")]
            CudaBf16 = "cuda-bf16" => ::burn::backend::Autodiff<::burn::backend::Cuda<::burn::tensor::bf16>>,
            #[cfg(feature = "cuda")]
            CudaF16 = "cuda-f16" => ::burn::backend::Autodiff<::burn::backend::Cuda<::burn::tensor::f16>>,
            #[cfg(feature = "wgpu")]
            Wgpu = "wgpu" => ::burn::backend::Autodiff<::burn::backend::Wgpu>,
        }
    };
}

pub(crate) use for_each_backend;

//! The one list of backends kiln computes on. Adding a backend is one entry here (and, when its
//! ranks need more than a default device, its `backend::RankBackend` impl): the list expands
//! into `backend::BackendKind` and its names, the dispatch of a run and of an evaluation to the
//! backend's type, and every model's compute on it.
//!
//! `for_each_backend!(m)` calls macro `m` once with every entry, each as
//! `#[cfg(..)] Variant = "name" => BurnAutodiffType`, comma-separated.
//!
//! The compute dtype (`backend.precision`) is not part of the type: Burn 0.21's tensors carry
//! their dtype at run time, so each rank sets its device's default float dtype
//! (`backend::RankBackend::prepare`) and one type per backend serves f32, bf16 and f16.

macro_rules! for_each_backend {
    ($m:ident) => {
        $m! {
            #[cfg(all())]
            Ndarray = "ndarray" => ::burn::backend::Autodiff<::burn::backend::NdArray>,
            #[cfg(all())]
            Flex = "flex" => ::burn::backend::Autodiff<::burn::backend::Flex>,
            #[cfg(feature = "cuda")]
            Cuda = "cuda" => ::burn::backend::Autodiff<::burn::backend::Cuda<f32>>,
            #[cfg(feature = "wgpu")]
            Wgpu = "wgpu" => ::burn::backend::Autodiff<::burn::backend::Wgpu>,
        }
    };
}

pub(crate) use for_each_backend;

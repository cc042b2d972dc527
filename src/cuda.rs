//! CUDA discovery through cudarc's dynamically loaded driver API: never panics when the driver
//! or a device is missing, so `kiln` can explain what to fix instead.

/// Number of CUDA devices, or why there are none.
pub fn device_count() -> Result<usize, String> {
    // SAFETY: only probes whether the driver library can be loaded.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("the CUDA driver library (libcuda.so) could not be loaded".into());
    }
    cudarc::driver::result::init().map_err(|e| format!("cuInit failed: {e:?}"))?;
    cudarc::driver::result::device::get_count()
        .map(|n| n.max(0) as usize)
        .map_err(|e| format!("cuDeviceGetCount failed: {e:?}"))
}

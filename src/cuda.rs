//! Layer: cuda (above `params`; below `collective`).
//!
//! CUDA and NCCL discovery through cudarc's dynamically loaded libraries: never panics when the
//! driver, a device or NCCL is missing, so `kiln` can explain what to fix instead.
//!
//! cudarc looks for NCCL as `libnccl.so` (and a few versioned names, not `libnccl.so.2`), but the
//! pip wheel `nvidia-nccl-cu13` ships only `nvidia/nccl/lib/libnccl.so.2`. When NCCL is not
//! loadable as is, kiln searches `KILN_NCCL_LIBRARY` (a file or directory), `LD_LIBRARY_PATH`,
//! the standard library directories and Python's site-packages, links the library it finds as
//! `libnccl.so` in a private directory, and re-executes itself with that directory first in
//! `LD_LIBRARY_PATH` (the dynamic loader reads it only at start-up).

use std::path::{Path, PathBuf};

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

/// The driver's CUDA version as (major, minor).
pub fn driver_version() -> Option<(i32, i32)> {
    // SAFETY: probes the library, then calls cuDriverGetVersion with a valid out-pointer.
    unsafe {
        if !cudarc::driver::sys::is_culib_present() {
            return None;
        }
        let mut v = 0i32;
        cudarc::driver::sys::cuDriverGetVersion(&mut v)
            .result()
            .ok()?;
        Some((v / 1000, (v % 1000) / 10))
    }
}

/// The name of GPU `ordinal` (one context, on that GPU only).
pub fn gpu_name(ordinal: usize) -> Option<String> {
    cudarc::driver::CudaContext::new(ordinal).ok()?.name().ok()
}

/// (name, total memory in bytes) of each GPU.
pub fn gpus() -> Vec<(String, usize)> {
    let n = device_count().unwrap_or(0);
    (0..n)
        .filter_map(|i| {
            let ctx = cudarc::driver::CudaContext::new(i).ok()?;
            Some((ctx.name().ok()?, ctx.total_mem().ok()?))
        })
        .collect()
}

/// Whether cudarc can load NCCL as the process stands.
pub fn nccl_loadable() -> bool {
    // SAFETY: only probes whether the library can be loaded.
    unsafe { cudarc::nccl::sys::is_culib_present() }
}

/// NCCL's version as "major.minor.patch".
pub fn nccl_version() -> Option<String> {
    if !nccl_loadable() {
        return None;
    }
    let v = cudarc::nccl::result::get_nccl_version().ok()?;
    // NCCL >= 2.9 encodes major*10000 + minor*100 + patch
    Some(format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100))
}

fn python_site_dirs() -> Vec<PathBuf> {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import sys; print('\\n'.join(p for p in sys.path if p))",
        ])
        .stderr(std::process::Stdio::null())
        .output();
    match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(PathBuf::from)
            .collect(),
        _ => Vec::new(),
    }
}

/// Directories searched for NCCL, in order.
pub fn nccl_search_dirs(
    env_override: Option<&str>,
    ld_library_path: Option<&str>,
    site: &[PathBuf],
) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(o) = env_override {
        let p = PathBuf::from(o);
        dirs.push(if p.is_file() {
            p.parent().map(Path::to_path_buf).unwrap_or(p)
        } else {
            p
        });
    }
    if let Some(ld) = ld_library_path {
        dirs.extend(ld.split(':').filter(|s| !s.is_empty()).map(PathBuf::from));
    }
    for d in [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/local/lib",
        "/usr/local/cuda/lib64",
        "/usr/local/nccl/lib",
    ] {
        dirs.push(PathBuf::from(d));
    }
    dirs.extend(site.iter().map(|s| s.join("nvidia/nccl/lib")));
    dirs
}

/// The first NCCL library file in `dirs` (`libnccl.so` or a versioned `libnccl.so.N...`).
pub fn find_nccl_in(dirs: &[PathBuf]) -> Option<PathBuf> {
    for d in dirs {
        let exact = d.join("libnccl.so");
        if exact.is_file() {
            return Some(exact);
        }
        let mut versioned: Vec<PathBuf> = std::fs::read_dir(d)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|f| f.to_str())
                    .is_some_and(|f| f.starts_with("libnccl.so."))
            })
            .collect();
        versioned.sort();
        if let Some(p) = versioned.into_iter().next() {
            return Some(p);
        }
    }
    None
}

/// Finds NCCL on this machine (see the module docs).
pub fn find_nccl() -> Option<PathBuf> {
    let over = std::env::var("KILN_NCCL_LIBRARY").ok();
    if let Some(o) = &over {
        let p = PathBuf::from(o);
        if p.is_file() {
            return Some(p);
        }
    }
    let ld = std::env::var("LD_LIBRARY_PATH").ok();
    find_nccl_in(&nccl_search_dirs(
        over.as_deref(),
        ld.as_deref(),
        &python_site_dirs(),
    ))
}

/// When NCCL exists but is not loadable under the name cudarc uses, links it as `libnccl.so` in
/// a private directory and re-executes kiln with that directory in `LD_LIBRARY_PATH`. Returns
/// only when nothing needs doing, or with a warning when re-executing failed. `main` calls it
/// first, before any thread or file exists (the one place kiln re-executes itself).
pub fn ensure_nccl_loadable() -> Option<String> {
    const GUARD: &str = "KILN_NCCL_SHIM";
    if std::env::var_os(GUARD).is_some() || nccl_loadable() {
        return None;
    }
    let Some(lib) = find_nccl() else { return None };
    let dir = std::env::temp_dir().join(format!("kiln-nccl-{}", std::process::id()));
    let link = dir.join("libnccl.so");
    if std::fs::create_dir_all(&dir).is_err() {
        return None;
    }
    let _ = std::fs::remove_file(&link);
    if std::os::unix::fs::symlink(&lib, &link).is_err() {
        return None;
    }
    let ld = match std::env::var("LD_LIBRARY_PATH") {
        Ok(old) if !old.is_empty() => format!("{}:{old}", dir.display()),
        _ => dir.display().to_string(),
    };
    let Ok(exe) = std::env::current_exe() else {
        return None;
    };
    use std::os::unix::process::CommandExt;
    let err = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env("LD_LIBRARY_PATH", ld)
        .env(GUARD, &lib)
        .exec();
    Some(format!(
        "warning: could not re-execute kiln to load NCCL from {}: {err}",
        lib.display()
    ))
}

/// What to tell the user about NCCL.
pub fn nccl_hint() -> String {
    match (nccl_loadable(), find_nccl()) {
        (true, _) => String::new(),
        (false, Some(p)) => format!(
            "NCCL found at {} but not loadable as libnccl.so; run `ln -s {} <dir>/libnccl.so` and add <dir> to LD_LIBRARY_PATH, or set KILN_NCCL_LIBRARY={}",
            p.display(),
            p.display(),
            p.display()
        ),
        (false, None) => "NCCL not found: `pip install nvidia-nccl-cu13` (or cu12), or install libnccl2, or set KILN_NCCL_LIBRARY=/path/to/libnccl.so.2".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_versioned_nccl_in_site_packages_and_the_override_first() {
        let d = crate::testdir::tempdir().unwrap();
        let site = d.path().join("site");
        let lib = site.join("nvidia/nccl/lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libnccl.so.2"), b"").unwrap();
        let dirs = nccl_search_dirs(None, Some("/nonexistent"), &[site.clone()]);
        assert_eq!(find_nccl_in(&dirs[..1]), None);
        assert_eq!(find_nccl_in(&[lib.clone()]), Some(lib.join("libnccl.so.2")));
        let over = d.path().join("over");
        std::fs::create_dir_all(&over).unwrap();
        std::fs::write(over.join("libnccl.so"), b"").unwrap();
        let dirs = nccl_search_dirs(Some(over.to_str().unwrap()), None, &[site]);
        assert_eq!(find_nccl_in(&dirs), Some(over.join("libnccl.so")));
    }
}

/// The device address of a flat CUDA tensor (`RawFn` for `Cuda<F>`): resolves Burn's fusion
/// layer to the cubecl buffer, takes its pointer through cubecl's `get_resource`, and waits until
/// cubecl's stream has finished every write to it (the stream is private to cubecl, so the
/// collective runs on its own stream and synchronises before returning).
pub fn raw_buf<F: burn_cubecl::FloatElement>(
    t: &burn::tensor::Tensor<burn::backend::Cuda<F>, 1>,
) -> Result<(crate::params::RawBuf, Box<dyn std::any::Any>), String> {
    use crate::params::{DevDType, RawBuf};
    use burn::tensor::backend::Backend;
    use burn::tensor::DType;

    type Inner<F> = burn_cubecl::CubeBackend<burn_cubecl::cubecl::cuda::CudaRuntime, F, i32, u8>;
    let len = t.dims()[0];
    let device = t.device();
    let fusion = t.clone().into_primitive().tensor();
    let cube = fusion
        .client
        .clone()
        .resolve_tensor_float::<Inner<F>>(fusion);
    if !cube.is_contiguous() {
        return Err("the gradient buffer is not contiguous".into());
    }
    let dtype = match cube.dtype {
        DType::F32 => DevDType::F32,
        DType::F16 => DevDType::F16,
        DType::BF16 => DevDType::Bf16,
        other => return Err(format!("no NCCL type for {other:?}")),
    };
    let resource = cube
        .client
        .get_resource(cube.handle.clone())
        .map_err(|e| format!("cubecl get_resource: {e:?}"))?;
    let ptr = resource.resource().ptr;
    <burn::backend::Cuda<F> as Backend>::sync(&device)
        .map_err(|e| format!("synchronising the CUDA stream: {e:?}"))?;
    Ok((RawBuf { ptr, len, dtype }, Box::new((resource, cube))))
}

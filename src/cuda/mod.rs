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

pub mod toolkit;

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

/// (name, total memory in bytes) of each GPU, asked of the driver without making a context
/// on any (a context would take memory, and on a GPU in exclusive-process mode the GPU itself,
/// from the rank it belongs to).
pub fn gpus() -> Vec<(String, usize)> {
    use cudarc::driver::result::device;
    let n = device_count().unwrap_or(0);
    (0..n)
        .filter_map(|i| {
            let dev = device::get(i as i32).ok()?;
            // SAFETY: `dev` is a device handle the driver just gave
            let mem = unsafe { device::total_mem(dev) }.ok()?;
            Some((device::get_name(dev).ok()?, mem))
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

/// The NCCL library file in `dirs` (`libnccl.so`, or the newest versioned `libnccl.so.N...`).
pub fn find_nccl_in(dirs: &[PathBuf]) -> Option<PathBuf> {
    toolkit::find_library_in(dirs, "libnccl.so")
}

/// Finds NCCL on this machine (see the module docs).
pub fn find_nccl() -> Option<PathBuf> {
    // a relative path would make a dangling link in kiln's cache: made absolute first
    let over = std::env::var("KILN_NCCL_LIBRARY")
        .ok()
        .filter(|o| !o.is_empty())
        .map(|o| {
            let p = PathBuf::from(&o);
            p.canonicalize().unwrap_or(p).display().to_string()
        });
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

/// Whether cudarc can load NVRTC (the kernel compiler cubecl uses) as the process stands.
pub fn nvrtc_loadable() -> bool {
    // SAFETY: only probes whether the library can be loaded.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// NVRTC's version as (major, minor).
pub fn nvrtc_version() -> Option<(i32, i32)> {
    if !nvrtc_loadable() {
        return None;
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is loaded; valid out-pointers.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    (r == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS).then_some((major, minor))
}

/// The CUDA toolkit (headers and NVRTC) as cubecl will use it: `CUDA_PATH` when it has the
/// headers, else the first of the system install, `nvcc` on PATH and Python's site-packages.
pub fn find_toolkit() -> Result<toolkit::Toolkit, Vec<String>> {
    let cuda_path = std::env::var("CUDA_PATH").ok();
    let path = std::env::var("PATH").ok();
    let system = toolkit::system_roots();
    // site-packages only when nothing else has it (starting Python costs a few milliseconds)
    let quick = toolkit::find_in(&toolkit::candidates(
        cuda_path.as_deref(),
        path.as_deref(),
        &[],
        &system,
    ));
    match quick {
        // CUDA_PATH that kiln itself set (the re-exec) still says where the toolkit came from
        Ok(mut t) if t.from == "CUDA_PATH" => {
            if let Ok(from) = std::env::var("KILN_CUDA_PATH_FROM") {
                t.from = format!("{from}; CUDA_PATH set by kiln");
            }
            Ok(t)
        }
        Ok(t) => Ok(t),
        Err(mut why) => {
            toolkit::find_in(&toolkit::candidates(None, None, &python_site_dirs(), &[])).map_err(
                |more| {
                    why.extend(more);
                    why
                },
            )
        }
    }
}

/// Where kiln keeps what it makes for itself (the NCCL link, cubecl's compiled kernels):
/// `KILN_CACHE_DIR`, else `$XDG_CACHE_HOME/kiln`, else `~/.cache/kiln`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("KILN_CACHE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("kiln");
    }
    match std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        Some(h) => PathBuf::from(h).join(".cache").join("kiln"),
        None => std::env::temp_dir().join("kiln-cache"),
    }
}

/// A directory holding `libnccl.so` -> `lib`, one per NCCL library (reused by every run; the
/// link is replaced atomically when it points elsewhere).
fn nccl_shim(lib: &Path) -> Option<PathBuf> {
    let key = lib.display().to_string();
    // FNV-1a: a stable name for this library's directory
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let dir = cache_dir().join("nccl").join(format!("{hash:016x}"));
    std::fs::create_dir_all(&dir).ok()?;
    let link = dir.join("libnccl.so");
    if std::fs::read_link(&link).ok().as_deref() == Some(lib) {
        return Some(dir);
    }
    let tmp = dir.join(format!(".libnccl.so.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(lib, &tmp).ok()?;
    std::fs::rename(&tmp, &link).ok()?;
    Some(dir)
}

/// Whether cubecl, as the process stands, finds the CUDA headers where it looks (`CUDA_PATH`,
/// `/usr/local/cuda`, `/opt/cuda`, or `/usr` when `/usr/bin/nvcc` exists).
pub fn cubecl_finds_headers() -> bool {
    let root = match std::env::var("CUDA_PATH") {
        Ok(p) => PathBuf::from(p),
        Err(_) if Path::new("/usr/local/cuda").exists() => PathBuf::from("/usr/local/cuda"),
        Err(_) if Path::new("/opt/cuda").exists() => PathBuf::from("/opt/cuda"),
        Err(_) if Path::new("/usr/bin/nvcc").exists() => PathBuf::from("/usr"),
        Err(_) => return false,
    };
    root.join("include/cuda_runtime.h").is_file()
}

/// GPU 0's compute capability.
fn compute_capability() -> Option<(i32, i32)> {
    use cudarc::driver::sys::CUdevice_attribute as A;
    let ctx = cudarc::driver::CudaContext::new(0).ok()?;
    Some((
        ctx.attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
            .ok()?,
        ctx.attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
            .ok()?,
    ))
}

/// Where cubecl keeps the kernels it compiled and its autotune results (one directory per
/// cubecl version): a second CUDA process loads them instead of compiling again. Removing the
/// directory clears the cache.
pub fn kernel_cache_dir() -> PathBuf {
    cache_dir().join("cubecl-0.10")
}

/// Sets cubecl's configuration for this process before its first use: a `cubecl.toml` of the
/// working directory (or above) still applies, but the compiled-kernel cache is on (in
/// [`kernel_cache_dir`]) unless that file says otherwise, the autotune cache lives there too,
/// and `autotune` (`backend.autotune`) sets the autotune level.
pub fn configure_kernels(autotune: Option<crate::config::AutotuneLevel>) {
    use crate::config::AutotuneLevel;
    use burn_cubecl::cubecl::config::autotune::AutotuneLevel as Level;
    use burn_cubecl::cubecl::config::cache::CacheConfig;
    use burn_cubecl::cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // cubecl keys its cache by kernel and cubecl version only: the GPU architecture and
        // NVRTC's version go in the path (a shared home across GPUs, an NVRTC upgrade)
        let arch = compute_capability()
            .map(|(a, b)| format!("sm{a}{b}"))
            .unwrap_or_else(|| "sm-unknown".into());
        let nvrtc = nvrtc_version()
            .map(|(a, b)| format!("nvrtc{a}.{b}"))
            .unwrap_or_else(|| "nvrtc-unknown".into());
        let dir = kernel_cache_dir().join(format!("{arch}-{nvrtc}"));
        // a malformed cubecl.toml is cubecl's panic, not kiln's: then cubecl reads it itself
        let Ok(mut cfg) = std::panic::catch_unwind(|| {
            CubeClRuntimeConfig::from_current_dir().override_from_env()
        }) else {
            return;
        };
        if cfg.compilation.cache.is_none() {
            cfg.compilation.cache = Some(CacheConfig::File(dir.join("kernels")));
        }
        if matches!(cfg.autotune.cache, CacheConfig::Target) {
            cfg.autotune.cache = CacheConfig::File(dir.join("autotune"));
        }
        if let Some(level) = autotune {
            cfg.autotune.level = match level {
                AutotuneLevel::Minimal => Level::Minimal,
                AutotuneLevel::Balanced => Level::Balanced,
                AutotuneLevel::Extensive => Level::Extensive,
                AutotuneLevel::Full => Level::Full,
            };
        }
        // cubecl refuses a second configuration (it panics) once it has read one: then its
        // own stands
        if CubeClRuntimeConfig::storage().lock().is_none() {
            CubeClRuntimeConfig::set(cfg);
        }
    });
}

/// What `prepare_environment` did, for `kiln env` (set in the re-executed process).
const PREPARED: &str = "KILN_CUDA_ENV";
static PREPARED_INFO: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// What the re-exec at start-up did, when there was one.
pub fn prepared() -> Option<&'static str> {
    PREPARED_INFO.get().map(|s| s.as_str())
}

/// Makes NCCL and the CUDA toolkit loadable before anything else runs. `main` calls it first,
/// before any thread, socket, token or file exists (the one place kiln re-executes itself):
/// - NCCL found but not loadable under the name cudarc uses: links it as `libnccl.so` in a
///   directory of kiln's cache and puts that directory on the library path;
/// - the toolkit's headers elsewhere than cubecl looks (pip wheels): sets `CUDA_PATH`;
/// - NVRTC not loadable as the process stands: puts its directory on the library path.
///
/// The dynamic loader reads `LD_LIBRARY_PATH` only at start-up, so a changed library path
/// re-executes kiln with the same arguments (once: `KILN_CUDA_ENV` marks the second start).
/// `KILN_CUDA_REEXEC=force` re-executes even when nothing needs it (tests). Returns a warning
/// when re-executing failed.
pub fn prepare_environment() -> Option<String> {
    if let Some(done) = std::env::var_os(PREPARED) {
        // this is the re-executed process: remembered for `kiln env`, and not passed on to
        // children (sbatch, sweep trials), which prepare their own environment
        let _ = PREPARED_INFO.set(done.to_string_lossy().into_owned());
        std::env::remove_var(PREPARED);
        return None;
    }
    let force = std::env::var("KILN_CUDA_REEXEC").is_ok_and(|v| v == "force");
    let mut lib_dirs: Vec<PathBuf> = Vec::new();
    let mut vars: Vec<(&str, String)> = Vec::new();
    let mut done: Vec<String> = Vec::new();
    if !nccl_loadable() {
        if let Some(lib) = find_nccl() {
            if let Some(dir) = nccl_shim(&lib) {
                done.push(format!(
                    "NCCL {} linked in {}",
                    lib.display(),
                    dir.display()
                ));
                lib_dirs.push(dir);
                vars.push(("KILN_NCCL_SHIM", lib.display().to_string()));
            }
        }
    }
    if let Ok(t) = find_toolkit() {
        let cuda_path_ok = std::env::var("CUDA_PATH")
            .is_ok_and(|p| Path::new(&p).join("include/cuda_runtime.h").is_file());
        if !cuda_path_ok {
            done.push(format!("CUDA_PATH={} ({})", t.root.display(), t.from));
            vars.push(("CUDA_PATH", t.root.display().to_string()));
            vars.push(("KILN_CUDA_PATH_FROM", t.from.clone()));
        }
        if !nvrtc_loadable() {
            if let Some(dir) = t.nvrtc.parent() {
                done.push(format!("NVRTC from {}", dir.display()));
                lib_dirs.push(dir.to_path_buf());
            }
        }
    }
    if lib_dirs.is_empty() && !force {
        // nothing for the loader: the variables take effect in this process (one thread yet)
        for (k, v) in &vars {
            std::env::set_var(k, v);
        }
        return None;
    }
    let mut ld: Vec<String> = lib_dirs.iter().map(|d| d.display().to_string()).collect();
    if let Ok(old) = std::env::var("LD_LIBRARY_PATH") {
        ld.extend(old.split(':').filter(|s| !s.is_empty()).map(str::to_string));
    }
    let Ok(exe) = std::env::current_exe() else {
        return Some("warning: could not find kiln's own executable to re-execute it with the CUDA libraries on the library path".into());
    };
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(std::env::args_os().skip(1))
        .env("LD_LIBRARY_PATH", ld.join(":"))
        .env(
            PREPARED,
            if done.is_empty() {
                "re-executed".to_string()
            } else {
                done.join("; ")
            },
        );
    for (k, v) in &vars {
        cmd.env(k, v);
    }
    let err = cmd.exec();
    Some(format!(
        "warning: could not re-execute kiln with the CUDA libraries on the library path: {err}"
    ))
}

/// What to tell the user about NCCL.
pub fn nccl_hint() -> String {
    // the library itself, not kiln's link to it
    match (nccl_loadable(), find_nccl().map(|p| p.canonicalize().unwrap_or(p))) {
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
        let dirs = nccl_search_dirs(None, Some("/nonexistent"), std::slice::from_ref(&site));
        assert_eq!(find_nccl_in(&dirs[..1]), None);
        assert_eq!(
            find_nccl_in(std::slice::from_ref(&lib)),
            Some(lib.join("libnccl.so.2"))
        );
        let over = d.path().join("over");
        std::fs::create_dir_all(&over).unwrap();
        std::fs::write(over.join("libnccl.so"), b"").unwrap();
        let dirs = nccl_search_dirs(Some(over.to_str().unwrap()), None, &[site]);
        assert_eq!(find_nccl_in(&dirs), Some(over.join("libnccl.so")));
    }
}

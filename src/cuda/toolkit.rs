//! Finding the CUDA toolkit parts a CUDA run needs besides the driver: the headers
//! (`include/cuda_runtime.h`, which cubecl's NVRTC compiles every kernel against) and NVRTC
//! itself (`libnvrtc.so`). A machine whose CUDA comes only from PyTorch's pip wheels has both
//! under `site-packages/nvidia/cu13/{include,lib}` (cu12 wheels: `nvidia/cuda_runtime` and
//! `nvidia/cuda_nvrtc`), where cubecl does not look; kiln finds them and points `CUDA_PATH` and
//! the library path there.

use std::path::{Path, PathBuf};

/// A toolkit: `root/include/cuda_runtime.h` exists (cubecl reads `CUDA_PATH` as `root`) and
/// `nvrtc` is an NVRTC library file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Toolkit {
    pub root: PathBuf,
    pub nvrtc: PathBuf,
    /// Where it was found, in words (`CUDA_PATH`, `/usr/local/cuda`, `pip nvidia/cu13 in ...`).
    pub from: String,
}

/// Places a toolkit may be, in order: (root, how it was found, extra NVRTC directories).
pub fn candidates(
    cuda_path: Option<&str>,
    path_env: Option<&str>,
    site: &[PathBuf],
    system: &[PathBuf],
) -> Vec<(PathBuf, String, Vec<PathBuf>)> {
    let mut out = Vec::new();
    if let Some(p) = cuda_path.filter(|p| !p.is_empty()) {
        out.push((PathBuf::from(p), "CUDA_PATH".to_string(), Vec::new()));
    }
    for root in system {
        out.push((root.clone(), root.display().to_string(), Vec::new()));
    }
    for dir in path_env.unwrap_or("").split(':').filter(|d| !d.is_empty()) {
        let nvcc = Path::new(dir).join("nvcc");
        if nvcc.is_file() {
            if let Some(root) = Path::new(dir).parent() {
                out.push((
                    root.to_path_buf(),
                    format!("nvcc on PATH ({})", nvcc.display()),
                    Vec::new(),
                ));
            }
        }
    }
    for s in site {
        for v in ["cu13", "cu12"] {
            let root = s.join("nvidia").join(v);
            out.push((
                root,
                format!("pip nvidia/{v} in {}", s.display()),
                Vec::new(),
            ));
        }
        // cu12 wheels keep the runtime headers and NVRTC in packages of their own
        let nvidia = s.join("nvidia");
        out.push((
            nvidia.join("cuda_runtime"),
            format!("pip nvidia/cuda_runtime in {}", s.display()),
            vec![nvidia.join("cuda_nvrtc").join("lib")],
        ));
    }
    out
}

/// The toolkit roots a system install has: `/usr/local/cuda`, `/usr/local/cuda-*` (newest
/// first), `/opt/cuda`.
pub fn system_roots() -> Vec<PathBuf> {
    let mut out = vec![PathBuf::from("/usr/local/cuda")];
    let mut versions = entries_starting_with(Path::new("/usr/local"), "cuda-");
    versions.reverse();
    out.extend(versions);
    out.push(PathBuf::from("/opt/cuda"));
    out
}

/// The entries of `dir` whose names start with `prefix`, sorted.
pub fn entries_starting_with(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|f| f.to_str())
                .is_some_and(|f| f.starts_with(prefix))
        })
        .collect();
    out.sort();
    out
}

/// The shared library `name` (`libnvrtc.so`, `libnccl.so`) in the first of `dirs` that has it:
/// the exact name, else the newest versioned `name.N...` file.
pub fn find_library_in(dirs: &[PathBuf], name: &str) -> Option<PathBuf> {
    for d in dirs {
        let exact = d.join(name);
        if exact.is_file() {
            return Some(exact);
        }
        if let Some(p) = entries_starting_with(d, &format!("{name}.")).pop() {
            return Some(p);
        }
    }
    None
}

/// The NVRTC library file in `dirs` (never `libnvrtc-builtins`).
pub fn find_nvrtc_in(dirs: &[PathBuf]) -> Option<PathBuf> {
    find_library_in(dirs, "libnvrtc.so")
}

/// The first candidate with both the headers and NVRTC, or what each candidate lacked.
pub fn find_in(cands: &[(PathBuf, String, Vec<PathBuf>)]) -> Result<Toolkit, Vec<String>> {
    let mut why = Vec::new();
    for (root, from, extra) in cands {
        if !root.is_dir() {
            continue;
        }
        let header = root.join("include").join("cuda_runtime.h");
        let mut dirs: Vec<PathBuf> = [
            "lib64",
            "lib",
            "targets/x86_64-linux/lib",
            "lib/x86_64-linux-gnu",
            "lib/aarch64-linux-gnu",
            "targets/sbsa-linux/lib",
        ]
        .iter()
        .map(|d| root.join(d))
        .collect();
        dirs.extend(extra.iter().cloned());
        let nvrtc = find_nvrtc_in(&dirs);
        match (header.is_file(), nvrtc) {
            (true, Some(nvrtc)) => {
                return Ok(Toolkit {
                    root: root.clone(),
                    nvrtc,
                    from: from.clone(),
                })
            }
            (false, _) => why.push(format!("{from}: no {}", header.display())),
            (true, None) => why.push(format!(
                "{from}: no libnvrtc.so in {}",
                dirs.iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
    Err(why)
}

/// What to do when no toolkit was found.
pub const HELP: &str = "install the CUDA toolkit (headers and NVRTC), or `pip install nvidia-cuda-runtime nvidia-cuda-nvrtc` (CUDA 13 wheels), or set CUDA_PATH to a directory with include/cuda_runtime.h";

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(p: &Path) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b"").unwrap();
    }

    #[test]
    fn finds_pip_wheels_a_system_install_and_cuda_path_in_order() {
        let d = crate::testdir::tempdir().unwrap();
        let site = d.path().join("site");
        // cu13 wheels: one directory for both
        let cu13 = site.join("nvidia/cu13");
        touch(&cu13.join("include/cuda_runtime.h"));
        touch(&cu13.join("lib/libnvrtc.so.13"));
        touch(&cu13.join("lib/libnvrtc-builtins.so.13.0"));
        let cands = candidates(None, None, std::slice::from_ref(&site), &[]);
        let t = find_in(&cands).unwrap();
        assert_eq!(t.root, cu13);
        assert_eq!(t.nvrtc, cu13.join("lib/libnvrtc.so.13"));
        assert_eq!(t.from, format!("pip nvidia/cu13 in {}", site.display()));

        // a system install comes first; one without NVRTC is passed over, and said so
        let sys = d.path().join("usr-local-cuda");
        touch(&sys.join("include/cuda_runtime.h"));
        let cands = candidates(
            None,
            None,
            std::slice::from_ref(&site),
            std::slice::from_ref(&sys),
        );
        assert_eq!(find_in(&cands).unwrap().root, cu13);
        touch(&sys.join("lib64/libnvrtc.so"));
        assert_eq!(find_in(&cands).unwrap().root, sys);

        // CUDA_PATH first of all; nvcc on PATH names its toolkit
        let mine = d.path().join("mine");
        touch(&mine.join("include/cuda_runtime.h"));
        touch(&mine.join("targets/x86_64-linux/lib/libnvrtc.so.13.1"));
        touch(&mine.join("bin/nvcc"));
        let t = find_in(&candidates(
            Some(mine.to_str().unwrap()),
            None,
            std::slice::from_ref(&site),
            std::slice::from_ref(&sys),
        ))
        .unwrap();
        assert_eq!(
            (t.root.clone(), t.from.as_str()),
            (mine.clone(), "CUDA_PATH")
        );
        let path = format!("/nonexistent:{}", mine.join("bin").display());
        let t = find_in(&candidates(None, Some(&path), &[], &[])).unwrap();
        assert!(t.from.starts_with("nvcc on PATH"), "{}", t.from);
    }

    #[test]
    fn cu12_wheels_split_headers_and_nvrtc_and_what_is_missing_is_said() {
        let d = crate::testdir::tempdir().unwrap();
        let site = d.path().join("site");
        let rt = site.join("nvidia/cuda_runtime");
        touch(&rt.join("include/cuda_runtime.h"));
        let cands = candidates(None, None, std::slice::from_ref(&site), &[]);
        let why = find_in(&cands).unwrap_err();
        assert_eq!(why.len(), 1, "{why:?}");
        assert!(why[0].contains("no libnvrtc.so in"), "{why:?}");
        touch(&site.join("nvidia/cuda_nvrtc/lib/libnvrtc.so.12"));
        let t = find_in(&cands).unwrap();
        assert_eq!(t.root, rt);
        assert_eq!(t.nvrtc, site.join("nvidia/cuda_nvrtc/lib/libnvrtc.so.12"));
        // nothing at all: no reasons (no candidate directory exists), and the help says what
        // to install
        assert_eq!(find_in(&candidates(None, None, &[], &[])), Err(vec![]));
        assert!(HELP.contains("pip install nvidia-cuda-runtime nvidia-cuda-nvrtc"));
    }
}

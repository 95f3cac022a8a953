//! Finding the CUDA pieces at run time, without panicking.
//!
//! cudarc loads every CUDA library lazily and panics when one is missing, so
//! the runtime asks first: [`driver_present`] before the first driver call,
//! [`ensure_library`] before the first NVRTC or cuBLAS call. A library that is
//! not on the loader path but sits in the toolkit (`CUDA_HOME/lib64`) is loaded
//! from there by absolute path; once loaded, cudarc's own lookup by soname finds
//! the same copy. The toolkit root also gives NVRTC its include directory.
//!
//! The path logic takes its environment as arguments so it is unit-tested
//! without a toolkit.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock, PoisonError};

use super::error::GpuError;

/// The header NVRTC needs from the toolkit; its presence marks an include dir.
pub const MARKER_HEADER: &str = "cuda_bf16.h";

/// Where the toolkit is looked for when neither variable is set.
pub const DEFAULT_CUDA_ROOT: &str = "/usr/local/cuda";

/// The CUDA toolkit root and its include directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaToolkit {
    /// Toolkit root (`CUDA_HOME`, `CUDA_PATH` or [`DEFAULT_CUDA_ROOT`]).
    pub root: PathBuf,
    /// The directory holding [`MARKER_HEADER`].
    pub include: PathBuf,
}

/// Finds the toolkit from `CUDA_HOME`, then `CUDA_PATH`, then
/// [`DEFAULT_CUDA_ROOT`], then the folder above an `nvcc` on `PATH` (a
/// toolkit installed elsewhere without the usual symlink).
///
/// A variable that is set but points at a folder without the headers is an
/// error naming it, rather than a silent fall-through to another toolkit.
pub fn find_toolkit(
    cuda_home: Option<OsString>,
    cuda_path: Option<OsString>,
    path: Option<OsString>,
    exists: &dyn Fn(&Path) -> bool,
) -> Result<CudaToolkit, GpuError> {
    let include_of = |root: &Path| {
        [
            root.join("include"),
            root.join("targets").join("x86_64-linux").join("include"),
        ]
        .into_iter()
        .find(|inc| exists(&inc.join(MARKER_HEADER)))
    };
    for (var, value) in [("CUDA_HOME", cuda_home), ("CUDA_PATH", cuda_path)] {
        let Some(value) = value.filter(|v| !v.is_empty()) else {
            continue;
        };
        let root = PathBuf::from(value);
        return match include_of(&root) {
            Some(include) => Ok(CudaToolkit { root, include }),
            None => Err(GpuError::CudaHeadersNotFound {
                reason: format!("{var}={} has no include/{MARKER_HEADER}", root.display()),
            }),
        };
    }
    let default = PathBuf::from(DEFAULT_CUDA_ROOT);
    let from_nvcc = path
        .iter()
        .flat_map(std::env::split_paths)
        .find(|dir| exists(&dir.join("nvcc")))
        .and_then(|bin| bin.parent().map(Path::to_path_buf));
    for root in std::iter::once(default.clone()).chain(from_nvcc) {
        if let Some(include) = include_of(&root) {
            return Ok(CudaToolkit { root, include });
        }
    }
    Err(GpuError::CudaHeadersNotFound {
        reason: format!(
            "CUDA_HOME and CUDA_PATH are unset, {}/include/{MARKER_HEADER} does not exist and no nvcc on PATH has it",
            default.display()
        ),
    })
}

/// The toolkit found from the process environment.
pub fn toolkit_from_env() -> Result<CudaToolkit, GpuError> {
    find_toolkit(
        std::env::var_os("CUDA_HOME"),
        std::env::var_os("CUDA_PATH"),
        std::env::var_os("PATH"),
        &|p| p.is_file(),
    )
}

/// Folders of a toolkit that hold its shared libraries.
pub fn library_dirs(root: &Path) -> [PathBuf; 3] {
    [
        root.join("lib64"),
        root.join("targets").join("x86_64-linux").join("lib"),
        root.join("lib"),
    ]
}

/// The toolkit roots worth searching for libraries, in order, without
/// requiring headers (a runtime-only install has none).
fn library_roots() -> Vec<PathBuf> {
    let mut roots = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            roots.push(PathBuf::from(v));
        }
    }
    roots.push(PathBuf::from(DEFAULT_CUDA_ROOT));
    if let Some(path) = std::env::var_os("PATH") {
        let nvcc_root = std::env::split_paths(&path)
            .find(|dir| dir.join("nvcc").is_file())
            .and_then(|bin| bin.parent().map(Path::to_path_buf));
        roots.extend(nvcc_root);
    }
    roots
}

/// True when the driver library (`libcuda.so.1`) can be loaded.
pub fn driver_present() -> bool {
    // SAFETY: `is_culib_present` only tries `dlopen` on cudarc's candidate
    // names and drops what it opened; it calls no CUDA function.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// One of the toolkit libraries the runtime loads on demand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Library {
    /// `libnvrtc.so.13` (and its builtins).
    Nvrtc,
    /// `libcublas.so.13` (and `libcublasLt.so.13`, which it needs).
    Cublas,
}

impl Library {
    fn present(self) -> bool {
        match self {
            // SAFETY: as in `driver_present`: a dlopen probe, no CUDA call.
            Library::Nvrtc => unsafe { cudarc::nvrtc::sys::is_culib_present() },
            // SAFETY: as above.
            Library::Cublas => unsafe { cudarc::cublas::sys::is_culib_present() },
        }
    }

    fn name(self) -> &'static str {
        match self {
            Library::Nvrtc => "NVRTC",
            Library::Cublas => "cuBLAS",
        }
    }

    /// File-name prefixes to preload from a toolkit folder, dependencies first.
    fn files(self) -> &'static [&'static str] {
        match self {
            Library::Nvrtc => &["libnvrtc-builtins.so.13", "libnvrtc.so.13"],
            Library::Cublas => &["libcublasLt.so.13", "libcublas.so.13"],
        }
    }
}

/// Libraries loaded by absolute path, kept for the life of the process so
/// cudarc's later lookups by soname resolve to them.
fn preloaded() -> &'static Mutex<Vec<libloading::Library>> {
    static LIBS: OnceLock<Mutex<Vec<libloading::Library>>> = OnceLock::new();
    LIBS.get_or_init(|| Mutex::new(Vec::new()))
}

/// Makes `lib` loadable for cudarc, or says why it is not.
pub fn ensure_library(lib: Library) -> Result<(), GpuError> {
    if lib.present() {
        return Ok(());
    }
    let mut tried = Vec::new();
    for root in library_roots() {
        for dir in library_dirs(&root) {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            let names: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
            let mut loaded_any = false;
            for prefix in lib.files() {
                // `libnvrtc-builtins.so.13.0`, `libcublas.so.13.0.2.14`: take the
                // shortest match, which is the soname link when there is one.
                let found = names
                    .iter()
                    .filter(|p| {
                        p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.starts_with(prefix))
                    })
                    .min_by_key(|p| p.as_os_str().len());
                if let Some(path) = found {
                    // SAFETY: loading a CUDA toolkit library runs its ELF
                    // initialisers, which have no preconditions on us; the handle
                    // is kept alive in `preloaded()` until the process exits, so
                    // nothing cudarc resolves from it is ever unloaded.
                    if let Ok(handle) = unsafe { libloading::Library::new(path) } {
                        preloaded()
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(handle);
                        loaded_any = true;
                    }
                }
            }
            if loaded_any && lib.present() {
                return Ok(());
            }
            tried.push(dir.display().to_string());
        }
    }
    Err(GpuError::LibraryMissing {
        what: lib.name(),
        tried: format!("the loader path and {}", tried.join(", ")),
    })
}

/// The CUDA version the runtime's bindings are built for (`cuda-13000`).
pub const REQUIRED_DRIVER_VERSION: i32 = 13000;

/// Splits a driver version number (`13000`) into major and minor.
pub fn split_version(v: i32) -> (i32, i32) {
    (v / 1000, (v % 1000) / 10)
}

/// The oldest compute capability the runtime supports: bf16 tensor-core GEMMs
/// and native bf16 conversions need Ampere.
pub const MIN_COMPUTE_CAPABILITY: (i32, i32) = (8, 0);

/// Checks a compute capability against [`MIN_COMPUTE_CAPABILITY`].
pub fn check_compute_capability(
    ordinal: usize,
    name: &str,
    cc: (i32, i32),
) -> Result<(), GpuError> {
    if cc >= MIN_COMPUTE_CAPABILITY {
        Ok(())
    } else {
        Err(GpuError::UnsupportedComputeCapability {
            ordinal,
            name: name.to_owned(),
            major: cc.0,
            minor: cc.1,
            min_major: MIN_COMPUTE_CAPABILITY.0,
            min_minor: MIN_COMPUTE_CAPABILITY.1,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fs(files: &'static [&'static str]) -> impl Fn(&Path) -> bool {
        move |p| files.iter().any(|f| Path::new(f) == p)
    }

    #[test]
    fn cuda_home_wins_and_is_checked() {
        let exists = fs(&[
            "/opt/cuda-13/include/cuda_bf16.h",
            "/usr/local/cuda/include/cuda_bf16.h",
        ]);
        let tk = find_toolkit(
            Some("/opt/cuda-13".into()),
            Some("/other".into()),
            None,
            &exists,
        )
        .unwrap();
        assert_eq!(tk.root, PathBuf::from("/opt/cuda-13"));
        assert_eq!(tk.include, PathBuf::from("/opt/cuda-13/include"));

        let err = find_toolkit(Some("/nope".into()), None, None, &exists).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("CUDA_HOME=/nope has no include/cuda_bf16.h"),
            "{msg}"
        );
        assert!(msg.contains("set CUDA_HOME"), "{msg}");
    }

    #[test]
    fn cuda_path_then_default() {
        let exists = fs(&[
            "/c/targets/x86_64-linux/include/cuda_bf16.h",
            "/usr/local/cuda/include/cuda_bf16.h",
        ]);
        let tk = find_toolkit(None, Some("/c".into()), None, &exists).unwrap();
        assert_eq!(tk.include, PathBuf::from("/c/targets/x86_64-linux/include"));
        let tk = find_toolkit(Some("".into()), None, None, &exists).unwrap();
        assert_eq!(tk.root, PathBuf::from("/usr/local/cuda"));
        let err = find_toolkit(None, Some("/d".into()), None, &exists).unwrap_err();
        assert!(err.to_string().contains("CUDA_PATH=/d"), "{err}");
    }

    #[test]
    fn nvcc_on_path_is_the_last_resort() {
        let exists = fs(&[
            "/opt/cuda-13.0/bin/nvcc",
            "/opt/cuda-13.0/include/cuda_bf16.h",
        ]);
        let tk = find_toolkit(
            None,
            None,
            Some("/usr/bin:/opt/cuda-13.0/bin".into()),
            &exists,
        )
        .unwrap();
        assert_eq!(tk.root, PathBuf::from("/opt/cuda-13.0"));
        assert_eq!(tk.include, PathBuf::from("/opt/cuda-13.0/include"));
        let both = fs(&[
            "/opt/cuda-13.0/bin/nvcc",
            "/opt/cuda-13.0/include/cuda_bf16.h",
            "/usr/local/cuda/include/cuda_bf16.h",
        ]);
        let tk = find_toolkit(None, None, Some("/opt/cuda-13.0/bin".into()), &both).unwrap();
        assert_eq!(
            tk.root,
            PathBuf::from("/usr/local/cuda"),
            "the default comes first"
        );
    }

    #[test]
    fn nothing_found_names_cuda_home() {
        let err = find_toolkit(
            None,
            None,
            Some("/usr/bin:/opt/cuda-13.0/bin".into()),
            &|_| false,
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("CUDA_HOME and CUDA_PATH are unset"), "{msg}");
        assert!(msg.contains("/usr/local/cuda/include/cuda_bf16.h"), "{msg}");
    }

    #[test]
    fn versions_and_capabilities() {
        assert_eq!(split_version(13000), (13, 0));
        assert_eq!(split_version(12090), (12, 9));
        assert!(check_compute_capability(0, "H200", (9, 0)).is_ok());
        assert!(check_compute_capability(0, "A100", (8, 0)).is_ok());
        let e = check_compute_capability(1, "Tesla T4", (7, 5)).unwrap_err();
        assert!(
            e.to_string()
                .contains("GPU 1 (`Tesla T4`) has compute capability 7.5"),
            "{e}"
        );
    }

    #[test]
    fn library_dirs_cover_toolkit_layouts() {
        let dirs = library_dirs(Path::new("/usr/local/cuda"));
        assert_eq!(dirs[0], PathBuf::from("/usr/local/cuda/lib64"));
        assert_eq!(
            dirs[1],
            PathBuf::from("/usr/local/cuda/targets/x86_64-linux/lib")
        );
    }
}

//! NVRTC compilation of the embedded kernel sources, with a disk cache.
//!
//! **CUBIN, not PTX.** Each `.cu` file is compiled for the device's own
//! architecture (`sm_90` on an H100/H200) and the machine code is fetched with
//! `nvrtcGetCUBIN`. PTX would be compiled again by the driver's JIT at every
//! process start (or served from the driver's own cache, outside our control);
//! a CUBIN is final, loads in microseconds, fails loudly on the wrong GPU, and
//! makes our cache the only one that matters.
//!
//! **Cache.** A compiled module is stored under `STEPGRAPH_CACHE` (default: the
//! user cache dir, `~/.cache/stepgraph/kernels` on Linux), keyed by SHA-256 of
//! the source, the headers it may include, the compile options, the target
//! architecture and the NVRTC version. The file carries its own SHA-256, so a
//! truncated or corrupted entry is recompiled instead of being handed to the
//! driver. Writes go through a temporary file and a rename, so concurrent
//! processes never see half an entry.

use std::ffi::{CString, c_char, c_int};
use std::path::{Path, PathBuf};
use std::time::Instant;

use cudarc::nvrtc::sys as nv;
use sha2::{Digest, Sha256};

use super::error::{During as _, GpuError};
use super::probe;

/// Environment variable overriding the cache directory.
pub const CACHE_ENV: &str = "STEPGRAPH_CACHE";

/// Where compiled modules are cached.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum CachePolicy {
    /// `STEPGRAPH_CACHE` if set and non-empty, else the user cache dir.
    #[default]
    Default,
    /// This directory.
    Dir(PathBuf),
    /// No disk cache: compile every time.
    Disabled,
}

impl CachePolicy {
    /// The directory this policy uses, if any.
    pub fn resolve(&self) -> Option<PathBuf> {
        match self {
            CachePolicy::Default => {
                default_cache_dir(std::env::var_os(CACHE_ENV), dirs::cache_dir())
            }
            CachePolicy::Dir(d) => Some(d.clone()),
            CachePolicy::Disabled => None,
        }
    }
}

/// The default cache directory, from the environment value and the user cache dir.
pub fn default_cache_dir(
    env: Option<std::ffi::OsString>,
    user_cache: Option<PathBuf>,
) -> Option<PathBuf> {
    match env.filter(|v| !v.is_empty()) {
        Some(v) => Some(PathBuf::from(v)),
        None => user_cache.map(|d| d.join("stepgraph").join("kernels")),
    }
}

/// How a module was obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Loaded from the disk cache.
    Hit,
    /// Compiled, and stored in the cache.
    Miss,
    /// Compiled; the cache entry could not be written (the reason is not
    /// fatal: the next start compiles again).
    MissNotStored,
    /// Compiled; no cache is configured.
    Disabled,
}

/// What obtaining one kernel module cost.
#[derive(Clone, Debug, PartialEq)]
pub struct CompileReport {
    /// The module as messages name it: `kernels/<file>` for the crate's own
    /// files, the name or path a user module was given for the others.
    pub file: String,
    /// Hit, miss, ...
    pub outcome: CacheOutcome,
    /// Wall time to obtain the CUBIN (read or compile), in milliseconds.
    pub millis: f64,
    /// The cache entry, when there is a cache.
    pub path: Option<PathBuf>,
}

impl std::fmt::Display for CompileReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let outcome = match self.outcome {
            CacheOutcome::Hit => "hit",
            CacheOutcome::Miss => "miss",
            CacheOutcome::MissNotStored => "miss-not-stored",
            CacheOutcome::Disabled => "disabled",
        };
        write!(f, "{}: cache={outcome} {:.1} ms", self.file, self.millis)
    }
}

/// One of the crate's own `.cu`/`.cuh` files, embedded in the binary.
#[derive(Clone, Copy, Debug)]
pub struct SourceFile {
    /// File name relative to `kernels/`.
    pub file: &'static str,
    /// The source text.
    pub src: &'static str,
}

/// What NVRTC compiles or serves to an `#include`: the crate's embedded
/// [`SourceFile`]s and the owned [`SourceText`] of a user module go through
/// the same compile and cache path.
pub trait Source {
    /// The name NVRTC compiles it under; `#include "<file>"` finds a header
    /// by it, and the cache key covers it.
    fn file(&self) -> &str;
    /// The source text.
    fn src(&self) -> &str;
    /// How reports and errors name it.
    fn label(&self) -> String;
}

impl Source for SourceFile {
    fn file(&self) -> &str {
        self.file
    }
    fn src(&self) -> &str {
        self.src
    }
    fn label(&self) -> String {
        format!("kernels/{}", self.file)
    }
}

impl<S: Source + ?Sized> Source for &S {
    fn file(&self) -> &str {
        (**self).file()
    }
    fn src(&self) -> &str {
        (**self).src()
    }
    fn label(&self) -> String {
        (**self).label()
    }
}

/// A source held at run time: a user's kernel module or header, given as a
/// string or read from a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceText {
    /// The name NVRTC compiles it under (for a header: the name the
    /// modules `#include`).
    pub file: String,
    /// The source text.
    pub src: String,
    /// How reports and errors name it (the path it was read from, or the
    /// name it was given).
    pub label: String,
}

impl Source for SourceText {
    fn file(&self) -> &str {
        &self.file
    }
    fn src(&self) -> &str {
        &self.src
    }
    fn label(&self) -> String {
        self.label.clone()
    }
}

/// The NVRTC version, as `(major, minor)`.
pub fn nvrtc_version() -> Result<(i32, i32), GpuError> {
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: both pointers are to live stack integers; the library was found
    // by `probe::ensure_library(Nvrtc)` before any caller gets here.
    unsafe { nv::nvrtcVersion(&raw mut major, &raw mut minor) }
        .result()
        .during("query the NVRTC version")?;
    Ok((major, minor))
}

/// The architectures NVRTC can target, as numbers (`90` for `sm_90`).
pub fn supported_archs() -> Result<Vec<i32>, GpuError> {
    let mut n: c_int = 0;
    // SAFETY: `n` is a live stack integer.
    unsafe { nv::nvrtcGetNumSupportedArchs(&raw mut n) }
        .result()
        .during("list NVRTC architectures")?;
    let mut archs = vec![c_int::default(); usize::try_from(n).unwrap_or(0)];
    if !archs.is_empty() {
        // SAFETY: `archs` holds exactly the count NVRTC just reported.
        unsafe { nv::nvrtcGetSupportedArchs(archs.as_mut_ptr()) }
            .result()
            .during("list NVRTC architectures")?;
    }
    Ok(archs)
}

/// The options every module is compiled with, for architecture `arch`
/// (`sm_90`). The include directory is added separately: it does not change
/// the output for a given NVRTC version, so it stays out of the cache key.
pub fn compile_options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_owned(),
    ]
}

/// The cache key of `file` compiled with `options` for `arch` by NVRTC `nvrtc`.
pub fn cache_key<S: Source + ?Sized, H: Source>(
    file: &S,
    headers: &[H],
    options: &[String],
    arch: &str,
    nvrtc: (i32, i32),
) -> String {
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        // Length-prefixed, so no two different inputs hash the same stream.
        h.update(u64::try_from(bytes.len()).unwrap_or(u64::MAX).to_le_bytes());
        h.update(bytes);
    };
    field(b"stepgraph-kernel-cache-v1");
    field(file.file().as_bytes());
    field(file.src().as_bytes());
    for hdr in headers {
        field(hdr.file().as_bytes());
        field(hdr.src().as_bytes());
    }
    for o in options {
        field(o.as_bytes());
    }
    field(arch.as_bytes());
    field(format!("nvrtc-{}.{}", nvrtc.0, nvrtc.1).as_bytes());
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The cache file for `file` under `dir`. A user module's name may hold
/// any characters; the stem keeps only those safe in a file name (the key
/// alone makes the entry unique).
pub fn cache_path<S: Source + ?Sized>(dir: &Path, file: &S, arch: &str, key: &str) -> PathBuf {
    let stem: String = file
        .file()
        .trim_end_matches(".cu")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let short = key.get(..32).unwrap_or(key);
    dir.join(format!("{stem}-{arch}-{short}.cubin"))
}

const MAGIC: &[u8; 8] = b"SGCUBIN1";

/// A cache entry: magic, SHA-256 of the CUBIN, the CUBIN.
pub fn encode_entry(cubin: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAGIC.len() + 32 + cubin.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&Sha256::digest(cubin));
    out.extend_from_slice(cubin);
    out
}

/// The CUBIN of a cache entry, or `None` if it is not an intact entry.
pub fn decode_entry(bytes: &[u8]) -> Option<&[u8]> {
    let rest = bytes.strip_prefix(MAGIC.as_slice())?;
    let (digest, cubin) = rest.split_at_checked(32)?;
    (!cubin.is_empty() && Sha256::digest(cubin).as_slice() == digest).then_some(cubin)
}

fn store(path: &Path, cubin: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // Unique per process and per call, so threads and processes compiling the
    // same module at once never write the same temporary file.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp{}-{n}", std::process::id()));
    std::fs::write(&tmp, encode_entry(cubin))?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Returns the CUBIN of `file`, from the cache or freshly compiled.
pub fn obtain_cubin<S: Source + ?Sized, H: Source>(
    file: &S,
    headers: &[H],
    arch: &str,
    cache: Option<&Path>,
) -> Result<(Vec<u8>, CompileReport), GpuError> {
    let start = Instant::now();
    let options = compile_options(arch);
    let nvrtc = nvrtc_version()?;
    let key = cache_key(file, headers, &options, arch, nvrtc);
    let path = cache.map(|dir| cache_path(dir, file, arch, &key));
    if let Some(p) = &path
        && let Ok(bytes) = std::fs::read(p)
        && let Some(cubin) = decode_entry(&bytes)
    {
        let report = CompileReport {
            file: file.label(),
            outcome: CacheOutcome::Hit,
            millis: ms(start),
            path,
        };
        return Ok((cubin.to_vec(), report));
    }
    let toolkit = probe::toolkit_from_env()?;
    let mut all = options;
    all.push(format!("--include-path={}", toolkit.include.display()));
    let cubin = compile(file, headers, &all)?;
    let outcome = match &path {
        None => CacheOutcome::Disabled,
        Some(p) if store(p, &cubin).is_ok() => CacheOutcome::Miss,
        Some(_) => CacheOutcome::MissNotStored,
    };
    Ok((
        cubin,
        CompileReport {
            file: file.label(),
            outcome,
            millis: ms(start),
            path,
        },
    ))
}

fn ms(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e3
}

/// Destroys an NVRTC program on every path out of `compile`.
struct Program(nv::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by nvrtcCreateProgram and is
        // destroyed only here; NVRTC nulls the handle it is given.
        let _ = unsafe { nv::nvrtcDestroyProgram(&raw mut self.0) };
    }
}

fn cstring<S: Source + ?Sized>(file: &S, s: &str) -> Result<CString, GpuError> {
    CString::new(s).map_err(|_| GpuError::InvalidSource { file: file.label() })
}

/// Compiles `file` to a CUBIN with NVRTC; `headers` are served to its
/// `#include "..."` lines from memory.
pub fn compile<S: Source + ?Sized, H: Source>(
    file: &S,
    headers: &[H],
    options: &[String],
) -> Result<Vec<u8>, GpuError> {
    let src = cstring(file, file.src())?;
    let name = cstring(file, file.file())?;
    let hdr_srcs = headers
        .iter()
        .map(|h| cstring(h, h.src()))
        .collect::<Result<Vec<_>, _>>()?;
    let hdr_names = headers
        .iter()
        .map(|h| cstring(h, h.file()))
        .collect::<Result<Vec<_>, _>>()?;
    let hdr_src_ptrs: Vec<*const c_char> = hdr_srcs.iter().map(|s| s.as_ptr()).collect();
    let hdr_name_ptrs: Vec<*const c_char> = hdr_names.iter().map(|s| s.as_ptr()).collect();
    let opts = options
        .iter()
        .map(|o| cstring(file, o))
        .collect::<Result<Vec<_>, _>>()?;
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|s| s.as_ptr()).collect();
    let n_headers = c_int::try_from(headers.len()).map_err(|_| GpuError::SizeOverflow {
        what: "kernel headers",
        value: 0,
        target: "c_int",
    })?;
    let n_opts = c_int::try_from(opts.len()).map_err(|_| GpuError::SizeOverflow {
        what: "NVRTC options",
        value: 0,
        target: "c_int",
    })?;

    let mut prog = Program(std::ptr::null_mut());
    // SAFETY: every pointer is to a NUL-terminated CString (or an array of
    // `n_headers` of them) that outlives the program: NVRTC may keep
    // references to the source and names until the program is destroyed,
    // which `prog`'s Drop does before these locals go.
    unsafe {
        nv::nvrtcCreateProgram(
            &raw mut prog.0,
            src.as_ptr(),
            name.as_ptr(),
            n_headers,
            hdr_src_ptrs.as_ptr(),
            hdr_name_ptrs.as_ptr(),
        )
    }
    .result()
    .during("create an NVRTC program")?;

    // SAFETY: `prog` is a live program; `opt_ptrs` holds `n_opts` pointers to
    // CStrings alive for the call.
    let compiled = unsafe { nv::nvrtcCompileProgram(prog.0, n_opts, opt_ptrs.as_ptr()) };
    if compiled != nv::nvrtcResult::NVRTC_SUCCESS {
        let log = program_log(&prog).unwrap_or_else(|e| format!("(no log: {e})"));
        return Err(GpuError::Compile {
            file: file.label(),
            log: format!("{log}\n(nvrtc: {compiled:?})"),
        });
    }

    let mut size = 0usize;
    // SAFETY: `prog` compiled successfully; `size` is a live stack integer.
    unsafe { nv::nvrtcGetCUBINSize(prog.0, &raw mut size) }
        .result()
        .during("get the CUBIN size")?;
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` holds exactly the `size` bytes NVRTC reported for it.
    unsafe { nv::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr().cast()) }
        .result()
        .during("get the CUBIN")?;
    Ok(cubin)
}

fn program_log(prog: &Program) -> Result<String, GpuError> {
    let mut size = 0usize;
    // SAFETY: `prog` is a live program; `size` is a live stack integer.
    unsafe { nv::nvrtcGetProgramLogSize(prog.0, &raw mut size) }
        .result()
        .during("get the NVRTC log size")?;
    let mut log = vec![0u8; size.max(1)];
    // SAFETY: `log` holds at least the `size` bytes NVRTC reported (the log
    // and its NUL terminator).
    unsafe { nv::nvrtcGetProgramLog(prog.0, log.as_mut_ptr().cast()) }
        .result()
        .during("get the NVRTC log")?;
    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
    Ok(String::from_utf8_lossy(log.get(..end).unwrap_or_default())
        .trim_end()
        .to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: SourceFile = SourceFile {
        file: "a.cu",
        src: "extern \"C\" __global__ void k() {}",
    };
    const H: SourceFile = SourceFile {
        file: "common.cuh",
        src: "#define X 1",
    };

    #[test]
    fn key_covers_source_headers_options_arch_and_version() {
        let opts = compile_options("sm_90");
        let base = cache_key(&A, &[H], &opts, "sm_90", (13, 0));
        assert_eq!(base, cache_key(&A, &[H], &opts, "sm_90", (13, 0)), "stable");
        assert_eq!(base.len(), 64);
        let edited = SourceFile {
            src: "extern \"C\" __global__ void k() { }",
            ..A
        };
        assert_ne!(base, cache_key(&edited, &[H], &opts, "sm_90", (13, 0)));
        let hdr = SourceFile {
            src: "#define X 2",
            ..H
        };
        assert_ne!(base, cache_key(&A, &[hdr], &opts, "sm_90", (13, 0)));
        assert_ne!(
            base,
            cache_key(&A, &[H], &compile_options("sm_80"), "sm_90", (13, 0))
        );
        assert_ne!(base, cache_key(&A, &[H], &opts, "sm_80", (13, 0)));
        assert_ne!(base, cache_key(&A, &[H], &opts, "sm_90", (13, 1)));
        let renamed = SourceFile { file: "b.cu", ..A };
        assert_ne!(base, cache_key(&renamed, &[H], &opts, "sm_90", (13, 0)));
    }

    #[test]
    fn cache_dir_resolution() {
        assert_eq!(
            default_cache_dir(Some("/tmp/sg".into()), Some("/home/u/.cache".into())),
            Some("/tmp/sg".into())
        );
        assert_eq!(
            default_cache_dir(Some("".into()), Some("/home/u/.cache".into())),
            Some(PathBuf::from("/home/u/.cache/stepgraph/kernels"))
        );
        assert_eq!(default_cache_dir(None, None), None);
        assert_eq!(CachePolicy::Disabled.resolve(), None);
        assert_eq!(CachePolicy::Dir("/x".into()).resolve(), Some("/x".into()));
    }

    #[test]
    fn cache_path_names_file_and_arch() {
        let key = "ab".repeat(32);
        let p = cache_path(Path::new("/c"), &A, "sm_90", &key);
        assert_eq!(
            p,
            PathBuf::from(format!("/c/a-sm_90-{}.cubin", "ab".repeat(16)))
        );
        let user = SourceText {
            file: "my kernels/mlp v2.cu".to_owned(),
            src: String::new(),
            label: "examples/mlp v2.cu".to_owned(),
        };
        assert_eq!(
            cache_path(Path::new("/c"), &user, "sm_90", &key),
            PathBuf::from(format!(
                "/c/my_kernels_mlp_v2-sm_90-{}.cubin",
                "ab".repeat(16)
            ))
        );
        assert_eq!(A.label(), "kernels/a.cu");
        assert_eq!(user.label(), "examples/mlp v2.cu");
    }

    #[test]
    fn entries_round_trip_and_reject_damage() {
        let cubin = b"\x7fELF fake cubin bytes".to_vec();
        let entry = encode_entry(&cubin);
        assert_eq!(decode_entry(&entry), Some(cubin.as_slice()));
        let mut flipped = entry.clone();
        if let Some(last) = flipped.last_mut() {
            *last ^= 1;
        }
        assert_eq!(decode_entry(&flipped), None);
        assert_eq!(
            decode_entry(entry.get(..entry.len() - 1).unwrap_or_default()),
            None
        );
        assert_eq!(decode_entry(b"garbage"), None);
        assert_eq!(decode_entry(&encode_entry(b"")), None);
    }

    #[test]
    fn store_writes_an_intact_entry() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub").join("x.cubin");
        store(&p, b"cubin").unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(decode_entry(&bytes), Some(b"cubin".as_slice()));
        let leftovers: Vec<_> = std::fs::read_dir(p.parent().unwrap()).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temporary file left behind");
    }

    #[test]
    fn report_line_shows_outcome_and_time() {
        let r = CompileReport {
            file: "kernels/reduce.cu".to_owned(),
            outcome: CacheOutcome::Hit,
            millis: 1.26,
            path: None,
        };
        assert_eq!(r.to_string(), "kernels/reduce.cu: cache=hit 1.3 ms");
    }
}

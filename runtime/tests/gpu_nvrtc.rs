//! NVRTC compiles every embedded kernel source, and the disk cache serves the
//! second request. Needs the CUDA toolkit (NVRTC and its headers), not a GPU:
//! it also runs on a machine with `CUDA_HOME` pointing at an unpacked
//! toolkit (or the `nvidia-cuda-nvrtc` + `nvidia-cuda-runtime` wheels).

use stepgraph::device::nvrtc::{self, CacheOutcome};
use stepgraph::device::probe::{self, Library};
use stepgraph::kernels::{HEADERS, MODULES};

#[test]
#[ignore = "needs NVRTC and the CUDA headers (runs on the GPU machine)"]
fn every_kernel_source_compiles_and_is_cached() {
    probe::ensure_library(Library::Nvrtc).expect("NVRTC");
    let version = nvrtc::nvrtc_version().unwrap();
    let archs = nvrtc::supported_archs().unwrap();
    println!("NVRTC {}.{}, archs {archs:?}", version.0, version.1);
    let dir = tempfile::tempdir().unwrap();
    for arch in ["sm_80", "sm_90"] {
        for m in MODULES {
            let (cubin, first) = nvrtc::obtain_cubin(&m.source, HEADERS, arch, Some(dir.path()))
                .unwrap_or_else(|e| panic!("{arch}: {e}"));
            assert!(
                cubin.starts_with(b"\x7fELF"),
                "{}: not an ELF CUBIN",
                m.source.file
            );
            for f in m.functions {
                // Unmangled (extern "C") names appear verbatim in the symbol table.
                let found = cubin
                    .windows(f.len() + 1)
                    .any(|w| w.starts_with(f.as_bytes()) && w.last() == Some(&0));
                assert!(
                    found,
                    "{arch}: kernel {f} not in the CUBIN of kernels/{}",
                    m.source.file
                );
            }
            assert_eq!(first.outcome, CacheOutcome::Miss, "{first}");
            let (again, second) =
                nvrtc::obtain_cubin(&m.source, HEADERS, arch, Some(dir.path())).unwrap();
            assert_eq!(second.outcome, CacheOutcome::Hit, "{second}");
            assert_eq!(again, cubin);
            println!("{arch} {first} -> {second}, {} bytes", cubin.len());
        }
    }
}

#[test]
#[ignore = "needs NVRTC and the CUDA headers (runs on the GPU machine)"]
fn a_compile_error_names_the_file_and_carries_the_log() {
    probe::ensure_library(Library::Nvrtc).expect("NVRTC");
    let bad = nvrtc::SourceFile {
        file: "broken.cu",
        src: "extern \"C\" __global__ void k(float* x) { x[0] = undefined_name; }",
    };
    let err = nvrtc::obtain_cubin(&bad, HEADERS, "sm_90", None).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("kernels/broken.cu"), "{msg}");
    assert!(msg.contains("undefined_name"), "{msg}");
    println!("{msg}");
}

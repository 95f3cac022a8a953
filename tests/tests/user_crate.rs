//! Issue 17: a crate outside this workspace can write its own step. The
//! fixture crate `tests/user_crate` (its spec, its step struct, its ops and
//! a kernel of its own) is copied to a temporary directory, depends on
//! stepgraph by path, and is built by its own `cargo test`, offline: the
//! guard tests the derive generates in it run and pass. Then a buffer is
//! removed from its spec, and its build fails naming the spec's
//! `file:line:col`.
//!
//! Its builds share `<target>/user-crate`, so only the first run compiles
//! stepgraph's dependencies (one and a half minutes on two idle cores,
//! three on busy ones).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The workspace root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The target directory this test was built in (`<target>/<profile>/deps/
/// this-binary`), so that `CARGO_TARGET_DIR` is honoured.
fn target_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.ancestors().nth(3).map(Path::to_path_buf))
        .unwrap_or_else(|| root().join("target"))
}

/// Copies the fixture crate into `dir`, pointing it at this workspace's
/// stepgraph, with this workspace's lock file (so `--offline` resolves the
/// versions already in the local registry).
fn write_crate(dir: &Path) {
    let fixture = root().join("tests/user_crate");
    let runtime = root().join("runtime").canonicalize().expect("runtime/");
    let manifest = std::fs::read_to_string(fixture.join("Cargo.toml.in"))
        .expect("Cargo.toml.in")
        .replace("@STEPGRAPH@", &runtime.display().to_string());
    std::fs::write(dir.join("Cargo.toml"), manifest).unwrap();
    for sub in ["src/lib.rs", "specs/tiny.ron"] {
        let to = dir.join(sub);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(fixture.join(sub), &to).unwrap();
    }
    std::fs::copy(root().join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
}

fn cargo(dir: &Path, args: &[&str]) -> Output {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    Command::new(cargo)
        .args(args)
        .arg("--offline")
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target_dir().join("user-crate"))
        .env("CARGO_TERM_COLOR", "never")
        // No debug info: the guard tests need none, and the first build of
        // stepgraph's dependencies is shorter without it.
        .env("CARGO_PROFILE_DEV_DEBUG", "0")
        .output()
        .expect("run cargo")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn a_crate_outside_the_workspace_builds_its_own_step_and_runs_its_guard_tests() {
    let dir = tempfile::tempdir().unwrap();
    write_crate(dir.path());

    let out = cargo(dir.path(), &["test", "--lib"]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(
        out.status.success(),
        "cargo test failed:\n{stdout}\n{stderr}"
    );
    for name in [
        "unmoved_buffers_replay",
        "moving_x_is_refused",
        "moving_w_is_refused",
        "moving_hidden_is_refused",
        "moving_y_is_refused",
        "resizing_hidden_is_refused",
        "growing_hidden_is_refused",
        "moving_scratch_reduce_partials_is_refused",
    ] {
        assert!(
            stdout.contains(&format!("__stepgraph_guards_tiny::{name} ... ok")),
            "{name} did not run and pass:\n{stdout}"
        );
    }
    // 1 + 3 per buffer (moved, resized, grown) + 1 per scratch area.
    assert!(
        stdout.contains("test result: ok. 14 passed; 0 failed"),
        "{stdout}"
    );

    // The spec loses buffer `w`, which an op still takes.
    let spec_path = dir.path().join("specs/tiny.ron");
    let spec = std::fs::read_to_string(&spec_path).unwrap();
    let edited: String = spec
        .lines()
        .filter(|l| !l.contains("(name: \"w\""))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(edited.lines().count() + 1, spec.lines().count());
    std::fs::write(&spec_path, &edited).unwrap();
    let (line, col) = edited
        .lines()
        .enumerate()
        .find_map(|(i, l)| l.find("Ref(\"w\")").map(|c| (i + 1, c + "Ref(".len() + 1)))
        .expect("an op still takes w");

    let out = cargo(dir.path(), &["build"]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "the build must fail:\n{stderr}");
    assert!(
        stderr.contains(&format!("specs/tiny.ron:{line}:{col}")),
        "the error names the spec's file:line:col ({line}:{col}):\n{stderr}"
    );
    assert!(
        stderr.contains("op `crate::layer` takes buffer `w`, which is not declared"),
        "{stderr}"
    );
}

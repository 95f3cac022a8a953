//! `stepgraph check`: clean specs print one summary line each and exit 0; a
//! broken spec prints located diagnostics and exits 1; bad usage exits 2.

use std::path::Path;
use std::process::Command;

fn stepgraph(args: &[&str]) -> (i32, String, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(env!("CARGO_BIN_EXE_stepgraph"))
        .args(args)
        .current_dir(root)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn shipped_specs_are_clean_with_one_line_each() {
    let (code, out, err) = stepgraph(&["check", "specs/mamba3_f32.ron", "specs/mamba3_bf16.ron"]);
    assert_eq!(code, 0, "stderr: {err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            "specs/mamba3_f32.ron: step `Mamba3F32` ok (f32, 9 buffers, 6 ops, 1 scratch)",
            "specs/mamba3_bf16.ron: step `Mamba3Bf16` ok (bf16, 9 buffers, 6 ops, 3 scratch)",
        ]
    );
}

#[test]
fn broken_spec_prints_the_same_diagnostics_as_the_derive_and_exits_1() {
    let (code, out, err) = stepgraph(&[
        "check",
        "tests/ui/fail/many_errors.ron",
        "specs/mamba3_f32.ron",
    ]);
    assert_eq!(code, 1);
    assert!(
        out.contains("Mamba3F32"),
        "the clean spec is still summarized: {out}"
    );
    assert!(
        err.contains("error: op `crate::ops::layer` writes buffer `x`, but `x` is an Input"),
        "{err}"
    );
    assert!(
        err.contains("--> tests/ui/fail/many_errors.ron:12:36"),
        "{err}"
    );
    assert!(
        err.contains("error: Output buffer `y` is written by no op"),
        "{err}"
    );
    assert!(err.contains("1 of 2 spec(s) failed the check"), "{err}");
}

#[test]
fn missing_file_is_an_error_not_a_panic() {
    let (code, _, err) = stepgraph(&["check", "specs/nope.ron"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("cannot read spec file `specs/nope.ron`"),
        "{err}"
    );
}

#[test]
fn usage_errors_exit_2_in_claps_words() {
    let (code, _, err) = stepgraph(&["check"]);
    assert_eq!(code, 2);
    assert!(
        err.starts_with("error: the following required arguments were not provided")
            && err.contains("<SPECS>..."),
        "{err}"
    );
    let (code, _, err) = stepgraph(&["frobnicate"]);
    assert_eq!(code, 2);
    assert!(
        err.starts_with("error: unrecognized subcommand 'frobnicate'"),
        "{err}"
    );
}

//! Feeds a corpus of broken specs to the checker: every one must yield at
//! least one located diagnostic, and nothing may panic. The corpus is the UI
//! fixtures, every prefix of a valid spec (truncation at each character), and
//! single-character corruptions of it.

use stepgraph_spec::Spec;

const VALID: &str = include_str!("../../specs/mamba3_bf16.ron");

fn must_fail(label: &str, src: &str) {
    let result = std::panic::catch_unwind(|| Spec::parse("corpus.ron", src));
    let Ok(result) = result else {
        panic!("the checker panicked on {label}")
    };
    let Err(diags) = result else {
        panic!("{label} was accepted:\n{src}")
    };
    assert!(!diags.list().is_empty(), "{label}: no diagnostics");
    for r in diags.rendered() {
        assert!(
            r.contains("corpus.ron"),
            "{label}: diagnostic without location: {r}"
        );
    }
}

#[test]
fn the_shipped_specs_are_clean() {
    for (name, src) in [
        ("mamba3_f32", include_str!("../../specs/mamba3_f32.ron")),
        ("mamba3_bf16", VALID),
        ("fake_step", include_str!("specs/fake_step.ron")),
    ] {
        if let Err(d) = Spec::parse(name, src) {
            panic!("{name} must be clean:\n{d}");
        }
    }
}

#[test]
fn every_truncation_is_rejected() {
    let chars: Vec<char> = VALID.chars().collect();
    // The spec ends with `)` and a newline; every strict prefix that cuts into
    // the body is broken.
    let body_end = VALID.trim_end().chars().count();
    for cut in 0..body_end {
        let src: String = chars[..cut].iter().collect();
        must_fail(&format!("the first {cut} characters"), &src);
    }
}

#[test]
fn corruptions_never_panic() {
    let chars: Vec<char> = VALID.chars().collect();
    for (i, _) in chars.iter().enumerate() {
        for repl in ['(', ')', '"', ',', ':', '[', 'x', '\u{0}', 'é'] {
            let mut c = chars.clone();
            c[i] = repl;
            let src: String = c.into_iter().collect();
            // Some corruptions land in comments and stay valid; none may panic.
            let _ = std::panic::catch_unwind(|| Spec::parse("corpus.ron", &src))
                .expect("checker panicked");
        }
    }
}

#[test]
fn every_ui_fixture_with_a_broken_spec_is_rejected() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("ui/fail");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if path.extension().is_some_and(|e| e == "ron") && !name.starts_with("struct_") {
            let src = std::fs::read_to_string(&path).unwrap();
            must_fail(&name, &src);
            n += 1;
        }
    }
    assert!(
        n >= 12,
        "expected at least 12 broken-spec fixtures, found {n}"
    );
}

#[test]
fn semantic_errors_are_all_reported_with_positions() {
    let src = VALID
        .replacen(
            r#"[Ref("weights"), Ref("tokens"), Mut("acts"), Mut("loss")]"#,
            r#"[Ref("weights"), Mut("tokens"), Mut("acts"), Ref("loss")]"#,
            1,
        )
        // The loss weighting op writes the loss too; make it read-only so
        // no op writes the Output.
        .replacen(
            r#"Mut("acts"), Mut("loss"), Mut("control")"#,
            r#"Mut("acts"), Ref("loss"), Mut("control")"#,
            1,
        )
        .replacen(
            r#""reduce_partials"]"#,
            r#""reduce_partials", "l2_cache"]"#,
            1,
        );
    // Where the unknown scratch name lands (the spec's comments move it).
    let (line, col) = src
        .lines()
        .enumerate()
        .find_map(|(i, l)| l.find(r#""l2_cache""#).map(|c| (i + 1, c + 1)))
        .expect("the corruption is in the source");
    let diags = Spec::parse("corpus.ron", &src).unwrap_err();
    let rendered = diags.rendered();
    assert_eq!(rendered.len(), 3, "{rendered:#?}");
    assert!(
        rendered[0].starts_with(&format!(
            "the runtime has no context scratch area `l2_cache`\n  --> corpus.ron:{line}:{col}\n"
        )),
        "{}",
        rendered[0]
    );
    assert!(
        rendered[1].contains("writes buffer `tokens`, but `tokens` is an Input"),
        "{}",
        rendered[1]
    );
    assert!(
        rendered[2].contains("Output buffer `loss` is written by no op"),
        "{}",
        rendered[2]
    );
}

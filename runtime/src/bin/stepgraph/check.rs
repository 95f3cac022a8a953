//! `stepgraph check SPEC...`: the derive's checks, at run time.

use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `stepgraph check`.
#[derive(clap::Args)]
pub struct Args {
    /// Spec files to check.
    #[arg(required = true)]
    specs: Vec<PathBuf>,
}

/// Checks every spec; prints a summary line per clean one and every
/// diagnostic of the others. Exit 0 when all are clean, 1 otherwise.
pub fn run(args: &Args) -> ExitCode {
    let mut failed = 0usize;
    for path in &args.specs {
        match stepgraph_spec::Spec::read(path) {
            Ok(spec) => println!("{}", spec.summary()),
            Err(diags) => {
                failed += 1;
                eprint!("{diags}");
            }
        }
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        eprintln!("{failed} of {} spec(s) failed the check", args.specs.len());
        ExitCode::from(1)
    }
}

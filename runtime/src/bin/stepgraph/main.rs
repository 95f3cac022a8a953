//! The `stepgraph` command line: `check` specs, `eval` checkpoints, `train` and
//! `bench` models. Each subcommand lives in its own module; this file only parses
//! arguments and maps outcomes to exit codes (0 ok, 1 failure, 2 usage error).

mod check;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Train Mamba-3 models with whole-step CUDA graphs.
#[derive(Parser)]
#[command(name = "stepgraph", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check step specs with the same rules as `#[derive(TrainingGraph)]`.
    Check(check::Args),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version are not usage errors.
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match cli.command {
        Command::Check(args) => check::run(&args),
    }
}

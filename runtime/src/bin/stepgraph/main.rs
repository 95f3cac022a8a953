//! The `stepgraph` command line: `check` specs, `eval` checkpoints, `init`
//! them, `train` and `bench` models, `repro` a paper's table. Each subcommand lives in its own module;
//! this file parses arguments and reports usage errors.
//!
//! Usage errors are clap's own output (the argument named, its possible
//! values, a did-you-mean, the usage line) and exit code 2, also for the
//! problems only a subcommand can see (a model size, a run directory in
//! use): those go through [`usage_error`], so they read the same. Other
//! failures are one `error:` line and exit code 1.

mod bench;
mod check;
mod eval;
mod init;
mod parse;
mod repro;
mod train;

use std::fmt::Display;
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// Train Mamba-3 models with whole-step CUDA graphs.
#[derive(Parser)]
#[command(name = "stepgraph", version, about, arg_required_else_help = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Step time, tokens/s and MFU of the training step, eager vs graph.
    Bench(Box<bench::Args>),
    /// Check step specs with the same rules as `#[derive(TrainingGraph)]`.
    Check(check::Args),
    /// Mean next-token cross-entropy of a checkpoint on a token file or a --data file.
    Eval(eval::Args),
    /// Write a checkpoint with fresh official-init weights.
    Init(init::Args),
    /// Reproduce a table of the Mamba-3 paper: `state-tracking` (Table 5b).
    Repro(Box<repro::Args>),
    /// Train a Mamba-3 model on a synthetic task or a token file.
    Train(Box<train::Args>),
}

/// Reports a usage error of `subcommand` the way clap reports its own
/// (message, usage line, `--help` tip) and exits with code 2.
pub(crate) fn usage_error(subcommand: &str, message: impl Display) -> ! {
    let mut cli = Cli::command();
    cli.build();
    let message = message.to_string();
    match cli.find_subcommand_mut(subcommand) {
        Some(sub) => sub.error(ErrorKind::ValueValidation, message).exit(),
        None => cli.error(ErrorKind::ValueValidation, message).exit(),
    }
}

fn main() -> ExitCode {
    // clap prints --help/--version (exit 0) and its usage errors (exit 2).
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    match cli.command {
        Command::Bench(args) => bench::run(&args),
        Command::Check(args) => check::run(&args),
        Command::Eval(args) => eval::run(&args),
        Command::Init(args) => init::run(&args),
        Command::Repro(args) => repro::run(&args),
        Command::Train(args) => match matches.subcommand_matches("train") {
            Some(m) => train::run(&args, m),
            None => usage_error("train", "arguments could not be read"),
        },
    }
}

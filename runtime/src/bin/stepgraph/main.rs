//! The `stepgraph` command line: `check` specs, `eval` checkpoints, `train` and
//! `bench` models. Each subcommand lives in its own module; this file only parses
//! arguments and maps outcomes to exit codes (0 ok, 1 failure, 2 usage error).

mod bench;
mod check;
mod eval;
mod init;
mod train;

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
    /// Step time, tokens/s and MFU of the training step, eager vs graph.
    Bench(Box<bench::Args>),
    /// Check step specs with the same rules as `#[derive(TrainingGraph)]`.
    Check(check::Args),
    /// Mean next-token cross-entropy of a checkpoint on a token file (CPU reference).
    Eval(eval::Args),
    /// Write a checkpoint with fresh official-init weights.
    Init(init::Args),
    /// Train a Mamba-3 model on a synthetic task or a token file.
    Train(Box<train::Args>),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version are not usage errors.
            if !e.use_stderr() {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            // One line: clap's first line names the problem; the usage and
            // tip lines after it are what `--help` is for.
            let text = e.render().to_string();
            let first = text
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("error: invalid arguments");
            eprintln!("{first} (see `stepgraph --help`)");
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Command::Bench(args) => bench::run(&args),
        Command::Check(args) => check::run(&args),
        Command::Eval(args) => eval::run(&args),
        Command::Init(args) => init::run(&args),
        Command::Train(args) => train::run(&args),
    }
}

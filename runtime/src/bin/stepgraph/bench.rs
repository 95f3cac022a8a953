//! `stepgraph bench`: step time, tokens/s and MFU of the training step,
//! eager vs graph, for the S, M, L configurations or any
//! `d_model/n_layer/d_state/headdim/batch/seq_len`; `--cold-start` times
//! the first step of a fresh process instead. A table on the terminal,
//! JSON with `--json`. Exit codes: 0 ok, 1 failure (one `error:` line),
//! 2 usage error.

use std::process::ExitCode;

use stepgraph::Precision;
use stepgraph::bench::{self, BenchConfig, BenchError, BenchOptions};

/// Arguments of `stepgraph bench`.
#[derive(clap::Args)]
pub struct Args {
    /// Configurations, comma-separated: S, M, L, or d_model/n_layer/d_state/headdim/batch/seq_len[/chunk].
    #[arg(long, default_value = "S,M,L")]
    config: String,
    /// Step precision: f32, or bf16 mixed precision (f32 masters, bf16 GEMMs).
    #[arg(long, default_value_t = Precision::F32, value_parser = crate::parse::precision(BENCH_PRECISIONS))]
    precision: Precision,
    /// Print the report as JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// Also write the JSON report to this file (the table still prints).
    #[arg(long)]
    json_out: Option<std::path::PathBuf>,
    /// Timed steps per mode (eager, graph).
    #[arg(long, default_value_t = 50)]
    steps: usize,
    /// Untimed warm-up steps before each timed series.
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// Timed passes of the per-op breakdown.
    #[arg(long, default_value_t = 5)]
    breakdown_reps: usize,
    /// Vocabulary of the full LM step (the backbone step has none).
    #[arg(long, default_value_t = bench::DEFAULT_VOCAB)]
    vocab: usize,
    /// Seconds one configuration may take; a slower one is skipped with a message.
    #[arg(long, default_value_t = 150.0)]
    budget_s: f64,
    /// Size n of the n x n x n bf16 GEMM that measures the ceiling.
    #[arg(long, default_value_t = 8192)]
    ceiling_n: usize,
    /// Time the first training step of fresh processes (empty, then warm kernel cache).
    #[arg(long, conflicts_with = "first_step")]
    cold_start: bool,
    /// Internal: one first step in this process, reported as a JSON line.
    #[arg(long, hide = true)]
    first_step: bool,
}

/// What `bench --precision` accepts (the GPU steps' precisions).
const BENCH_PRECISIONS: &[(Precision, &str)] = &[(Precision::F32, ""), (Precision::Bf16, "")];

/// Runs the subcommand.
pub fn run(args: &Args) -> ExitCode {
    match run_inner(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let text = e.to_string();
            eprintln!("error: {}", text.lines().next().unwrap_or("bench failed"));
            ExitCode::FAILURE
        }
    }
}

fn json<T: serde::Serialize>(v: &T) -> Result<String, BenchError> {
    Ok(serde_json::to_string_pretty(v)?)
}

fn run_inner(args: &Args) -> Result<(), BenchError> {
    let precision = args.precision;
    // A precision without a step is refused before any GPU work.
    bench::runner_for(precision)?;
    let configs = BenchConfig::parse_list(&args.config)?;
    if args.first_step {
        let cfg = configs
            .first()
            .ok_or(BenchError::Option("--first-step needs a --config"))?;
        let r = bench::cold::first_step(cfg, args.vocab, precision)?;
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    if args.cold_start {
        let exe = std::env::current_exe().map_err(BenchError::CurrentExe)?;
        let mut runs = Vec::new();
        for cfg in &configs {
            let r = bench::cold::cold_start(&exe, &cfg.name, precision)?;
            if !args.json {
                print!("{}", r.table());
            }
            runs.push(r);
        }
        emit(args, &json(&runs)?)?;
        return Ok(());
    }
    let opts = BenchOptions {
        configs,
        precision,
        vocab: args.vocab,
        steps: args.steps,
        warmup: args.warmup,
        breakdown_reps: args.breakdown_reps,
        budget_s: args.budget_s,
        ceiling_n: args.ceiling_n,
        ..BenchOptions::default()
    };
    let report = bench::run(&opts)?;
    if !args.json {
        print!("{}", report.table());
    }
    emit(args, &json(&report)?)?;
    match report.failures().first() {
        None => Ok(()),
        Some(f) => Err(BenchError::ConfigFailed {
            name: f.name.clone(),
            error: f.error.clone(),
        }),
    }
}

/// Prints `text` with `--json`, writes it to `--json-out`.
fn emit(args: &Args, text: &str) -> Result<(), BenchError> {
    if args.json {
        println!("{text}");
    }
    if let Some(path) = &args.json_out {
        std::fs::write(path, format!("{text}\n")).map_err(|source| BenchError::Io {
            action: "write",
            path: path.clone(),
            source,
        })?;
    }
    Ok(())
}

//! Runs the table's training jobs: a queue of (task, rotation, seed) runs
//! drained by `jobs` worker threads, each training one run at a time
//! through [`crate::train::train`].
//!
//! On a GPU every worker opens its own context stream, so the runs' graph
//! replays overlap on the device: the models are tiny, each step's kernels
//! fill a small part of an H200, and one run alone leaves it mostly idle.
//! Threads of one process share the device in a way separate processes
//! cannot (without MPS their kernels take turns). The queue is ordered seed
//! by seed, the longest runs of a seed first, so a run stopped early (a
//! signal, `--time-limit`) leaves whole seeds behind it. A queued run either
//! starts in an empty directory or continues the run its directory holds
//! ([`Start`], `--resume`).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::recipe::{Overrides, Recipe, recipe_with};
use crate::Precision;
use crate::train::data::{Task, mix_label, products_label};
use crate::train::dynamics::Dynamics;
use crate::train::report::{EvalResult, ProgressMode};
use crate::train::{Device, Resume, Rotation, RunStatus, Setting, Stop, TrainOptions, train};

/// One training run of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Job {
    /// Column.
    pub task: Task,
    /// Row.
    pub rotation: Rotation,
    /// Seed of weights and data.
    pub seed: u64,
}

impl Job {
    /// The run's directory name (`parity-data-s3`).
    pub fn name(&self) -> String {
        format!(
            "{}-{}-s{}",
            self.task.name(),
            self.rotation.name(),
            self.seed
        )
    }
}

/// How a queued run begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// A new run in its (absent or empty) directory.
    Fresh,
    /// Continue the run its directory holds, from the newest intact
    /// checkpoint; every setting is compared with the saved run's, so a
    /// recipe that changed since is an error, not a silently mixed run.
    Resume,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// It trained to its last step.
    Finished,
    /// A stop request (signal, time limit) ended it early.
    Stopped,
    /// It failed; the error's message.
    Failed(String),
    /// A stop request came before it started.
    Skipped,
}

/// What one run produced.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// The run.
    pub job: Job,
    /// How it ended.
    pub outcome: Outcome,
    /// Its directory.
    pub dir: PathBuf,
    /// Steps trained.
    pub steps: u64,
    /// Steps it was to train.
    pub total_steps: u64,
    /// Wall time.
    pub wall: Duration,
    /// Its last evaluation: training length first, then the reported one.
    pub eval: Vec<EvalResult>,
    /// The weight average's scores at that evaluation (`--ema`; empty
    /// without one).
    pub eval_ema: Vec<EvalResult>,
    /// The dynamics probe at that evaluation.
    pub dynamics: Option<Dynamics>,
    /// Mean training loss over its last steps.
    pub last_loss: Option<f64>,
}

impl RunResult {
    /// The run's scaled accuracy (%) at problem size `len`, if evaluated:
    /// the weight average's when the run kept one, as the table reports.
    pub fn scaled_at(&self, len: usize) -> Option<f64> {
        self.scaled_in(self.reported_scores(), len)
    }

    /// The trained weights' scaled accuracy (%) at problem size `len`.
    pub fn scaled_trained_at(&self, len: usize) -> Option<f64> {
        self.scaled_in(&self.eval, len)
    }

    fn scaled_in(&self, scores: &[EvalResult], len: usize) -> Option<f64> {
        scores
            .iter()
            .find(|r| r.length == Some(len))
            .map(|r| 100.0 * self.job.task.scaled_accuracy(r.accuracy))
    }

    /// The run's raw accuracy (%) on its zero-free products of `k` factors
    /// (`--eval-products`), weights as [`Self::scaled_at`]: a probe, whose
    /// chance (1/4: a product of units is never 0) is not the task's.
    pub fn products_accuracy(&self, k: usize) -> Option<f64> {
        let label = products_label(k);
        self.reported_scores()
            .iter()
            .find(|r| r.label == label)
            .map(|r| 100.0 * r.accuracy)
    }

    /// The scores the table reads: the weight average's when the run kept
    /// one.
    fn reported_scores(&self) -> &[EvalResult] {
        if self.eval_ema.is_empty() {
            &self.eval
        } else {
            &self.eval_ema
        }
    }

    /// The run's scaled accuracy (%) on its mixed eval set of sizes
    /// `lo..=hi` (`--eval-mix`), weights as [`Self::scaled_at`]; `None` for
    /// a run without one (tables written before it).
    pub fn scaled_mix(&self, lo: usize, hi: usize) -> Option<f64> {
        let label = mix_label(lo, hi);
        self.reported_scores()
            .iter()
            .find(|r| r.label == label)
            .map(|r| 100.0 * self.job.task.scaled_accuracy(r.accuracy))
    }
}

/// What the workers share.
pub struct Plan<'a> {
    /// Runs not yet started, and how each begins.
    pub queue: Mutex<VecDeque<(Job, Start)>>,
    /// Where each run's directory goes.
    pub runs_dir: &'a Path,
    /// Precision of every run.
    pub precision: Precision,
    /// Device of every run.
    pub device: Device,
    /// Smoke-test recipes.
    pub quick: bool,
    /// Changes to every recipe.
    pub overrides: Overrides,
    /// The step at which every run stops (`--stop-after`).
    pub stop_after: Option<u64>,
    /// Set on a signal or at the time limit.
    pub stop: &'a Stop,
}

/// The queue: seed by seed; within a seed the longest recipes first.
pub fn jobs(
    tasks: &[Task],
    rotations: &[Rotation],
    seeds: &[u64],
    quick: bool,
    overrides: &Overrides,
) -> Vec<Job> {
    let mut by_cost: Vec<Task> = tasks.to_vec();
    by_cost.sort_by_key(|&t| {
        let r = recipe_with(t, quick, overrides);
        std::cmp::Reverse(
            r.steps
                .saturating_mul(u64::try_from(r.n_layer).unwrap_or(u64::MAX)),
        )
    });
    let mut out = Vec::new();
    for &seed in seeds {
        for &task in &by_cost {
            for &rotation in rotations {
                out.push(Job {
                    task,
                    rotation,
                    seed,
                });
            }
        }
    }
    out
}

/// Takes jobs off the queue until it is empty or a stop is requested,
/// training each on GPU `gpu` (for GPU runs); `done` is called with each
/// result as it comes (in completion order).
pub fn work(plan: &Plan<'_>, gpu: usize, done: &(dyn Fn(RunResult) + Sync)) {
    loop {
        let next = plan
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front();
        let Some((job, start)) = next else {
            return;
        };
        done(run(plan, job, start, gpu));
    }
}

fn run(plan: &Plan<'_>, job: Job, start: Start, gpu: usize) -> RunResult {
    let r: Recipe = recipe_with(job.task, plan.quick, &plan.overrides);
    let dir = plan.runs_dir.join(job.name());
    let mut result = RunResult {
        job,
        outcome: Outcome::Skipped,
        dir: dir.clone(),
        steps: 0,
        total_steps: r.steps,
        wall: Duration::ZERO,
        eval: Vec::new(),
        eval_ema: Vec::new(),
        dynamics: None,
        last_loss: None,
    };
    if plan.stop.is_requested() {
        return result;
    }
    let opts = TrainOptions {
        run: r.run(
            job.rotation,
            job.seed,
            plan.precision,
            plan.device,
            plan.quick,
        ),
        run_dir: (start == Start::Fresh).then(|| dir.clone()),
        resume: (start == Start::Resume).then(|| Resume {
            from: dir,
            given: Setting::ALL.to_vec(),
        }),
        stop_after: plan.stop_after,
        progress: ProgressMode::Quiet,
        log_dynamics: true,
        gpu,
    };
    let t0 = Instant::now();
    let summary = train(&opts, plan.stop);
    result.wall = t0.elapsed();
    match summary {
        Ok(s) => {
            result.outcome = match s.status {
                RunStatus::Finished | RunStatus::AlreadyFinished => Outcome::Finished,
                RunStatus::Stopped => Outcome::Stopped,
            };
            result.steps = s.step;
            result.eval = s.eval;
            result.eval_ema = s.eval_ema;
            result.dynamics = s.dynamics;
            result.last_loss = s.last_loss.map(|w| w.mean);
        }
        Err(e) => result.outcome = Outcome::Failed(e.to_string()),
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repro::recipe::{ROTATIONS, TASKS};

    #[test]
    fn the_queue_goes_seed_by_seed_longest_first() {
        let q = jobs(&TASKS, &ROTATIONS, &[4, 5], false, &Overrides::default());
        assert_eq!(q.len(), 18);
        assert!(q[..9].iter().all(|j| j.seed == 4));
        assert_eq!(q[0].task, Task::ModarithPrec, "3 layers before 1");
        assert_eq!(q[8].task, Task::Parity);
        assert_eq!(q[0].name(), "modarith-prec-data-s4");
    }
}

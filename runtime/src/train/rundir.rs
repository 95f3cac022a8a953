//! Run directories: each belongs to exactly one run, and one process at a
//! time.
//!
//! A new run *claims* its directory: `runs/<UTC timestamp>` is created with
//! `create_dir` (atomic: of two runs started in the same second, one gets
//! `<timestamp>-2`), and `--run-dir DIR` must not exist or be empty. A
//! directory that holds anything else is refused with a message saying how
//! to resume it. While a process trains in a run directory it holds an
//! advisory lock on `DIR/.lock` (released by the OS when the process dies,
//! so a killed run leaves no stale lock), and a second `--resume` of the
//! same run is refused.
//!
//! A resumed run is *rewound* to its checkpoint: checkpoints newer than the
//! one resumed (an abandoned continuation, or unreadable ones) move to
//! `DIR/abandoned/<timestamp>/` with the metrics lines past that step, and
//! `metrics.jsonl` keeps only the steps up to it, so the metrics never hold
//! a step twice and no checkpoint is deleted.

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, ErrorKind, Write as _};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::TrainError;
use super::checkpoint::{self, CHECKPOINTS_DIR};
use super::report::METRICS_FILE;

/// The lock file inside a run directory.
pub const LOCK_FILE: &str = ".lock";
/// Where a rewind moves what it takes out of the run.
pub const ABANDONED_DIR: &str = "abandoned";

/// A run directory this process holds (its lock is released on drop).
#[derive(Debug)]
pub struct RunDir {
    path: PathBuf,
    _lock: File,
    fresh: bool,
}

impl RunDir {
    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Claims `path` for a new run: created if absent, else it must be empty.
    pub fn claim(path: &Path) -> Result<Self, TrainError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent).map_err(TrainError::io(parent))?;
        }
        match fs::create_dir(path) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                if !only_lock_inside(path)? {
                    return Err(taken(path));
                }
            }
            Err(e) => return Err(TrainError::io(path)(e)),
        }
        let lock = lock(path)?;
        // Two runs may both have found the directory empty; the one that got
        // the lock second finds the first one's files (or its lock) here.
        if !only_lock_inside(path)? {
            return Err(taken(path));
        }
        Ok(Self {
            path: path.to_path_buf(),
            _lock: lock,
            fresh: true,
        })
    }

    /// Claims a new `runs/<UTC timestamp>` directory (with a `-2`, `-3`, ...
    /// suffix when a run started in the same second already has it).
    pub fn claim_default() -> Result<Self, TrainError> {
        let root = Path::new("runs");
        fs::create_dir_all(root).map_err(TrainError::io(root))?;
        let stamp = utc_stamp();
        for k in 1u32.. {
            let dir = if k == 1 {
                root.join(&stamp)
            } else {
                root.join(format!("{stamp}-{k}"))
            };
            match fs::create_dir(&dir) {
                Ok(()) => {
                    let lock = lock(&dir)?;
                    return Ok(Self {
                        path: dir,
                        _lock: lock,
                        fresh: true,
                    });
                }
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                Err(e) => return Err(TrainError::io(&dir)(e)),
            }
        }
        Err(TrainError::Io {
            path: root.to_path_buf(),
            source: ErrorKind::AlreadyExists.into(),
        })
    }

    /// Opens an existing run to continue it.
    pub fn open(path: &Path) -> Result<Self, TrainError> {
        Ok(Self {
            path: path.to_path_buf(),
            _lock: lock(path)?,
            fresh: false,
        })
    }

    /// Removes a directory this process created when the run failed before
    /// writing anything into it, so a failed start leaves nothing behind.
    pub fn discard_if_unused(self) {
        if self.fresh && only_lock_inside(&self.path).unwrap_or(false) {
            let _ = fs::remove_dir_all(&self.path);
        }
    }

    /// Rewinds the run to checkpoint step `step`: moves the checkpoints past
    /// it and `extra` (unreadable ones, with why) to
    /// `abandoned/<timestamp>/`, and cuts `metrics.jsonl` after `step` (the
    /// lines cut go along when a checkpoint was moved; otherwise they are
    /// steps the run will compute again). Returns one line per thing moved
    /// or cut, for the log.
    pub fn rewind(
        &self,
        step: u64,
        extra: &[(PathBuf, String)],
    ) -> Result<Vec<String>, TrainError> {
        let root = self.path.join(CHECKPOINTS_DIR);
        let mut moving: Vec<(PathBuf, Option<String>)> = checkpoint::list(&root)?
            .into_iter()
            .filter(|&(s, _)| s > step)
            .map(|(_, dir)| (dir, None))
            .collect();
        for (dir, why) in extra {
            match moving.iter_mut().find(|(d, _)| d == dir) {
                Some(entry) => entry.1 = Some(why.clone()),
                None if dir.exists() => moving.push((dir.clone(), Some(why.clone()))),
                None => {}
            }
        }
        let mut notes = Vec::new();
        let archive = (!moving.is_empty()).then(|| {
            self.path
                .join(ABANDONED_DIR)
                .join(format!("{}-from-step-{step}", utc_stamp()))
        });
        if let Some(dest) = &archive {
            fs::create_dir_all(dest).map_err(TrainError::io(dest))?;
            for (dir, why) in &moving {
                let name = dir.file_name().unwrap_or(dir.as_os_str());
                let to = dest.join(name);
                fs::rename(dir, &to).map_err(TrainError::io(dir))?;
                notes.push(match why {
                    Some(why) => format!(
                        "moved unreadable {} ({why}) to {}",
                        name.display(),
                        to.display()
                    ),
                    None => format!(
                        "moved {} (past step {step}) to {}",
                        name.display(),
                        to.display()
                    ),
                });
            }
        }
        let (kept, cut) = split_metrics(&self.path.join(METRICS_FILE), step)?;
        if !cut.is_empty() {
            let path = self.path.join(METRICS_FILE);
            match &archive {
                Some(dest) => {
                    write_lines(&dest.join(METRICS_FILE), &cut)?;
                    notes.push(format!(
                        "moved {} metrics lines past step {step} to {}",
                        cut.len(),
                        dest.join(METRICS_FILE).display()
                    ));
                }
                None => notes.push(format!(
                    "dropped {} metrics lines past step {step} (steps not checkpointed, run again now)",
                    cut.len()
                )),
            }
            let tmp = self.path.join(format!(".{METRICS_FILE}.tmp"));
            write_lines(&tmp, &kept)?;
            fs::rename(&tmp, &path).map_err(TrainError::io(&path))?;
        }
        Ok(notes)
    }
}

/// Whether `path` is a directory holding nothing but (maybe) the lock file.
fn only_lock_inside(path: &Path) -> Result<bool, TrainError> {
    if !path.is_dir() {
        return Ok(false);
    }
    let entries = fs::read_dir(path).map_err(TrainError::io(path))?;
    for entry in entries {
        let entry = entry.map_err(TrainError::io(path))?;
        if entry.file_name() != LOCK_FILE {
            return Ok(false);
        }
    }
    Ok(true)
}

fn taken(path: &Path) -> TrainError {
    TrainError::RunDirTaken {
        dir: path.to_path_buf(),
        holds_run: path.join(CHECKPOINTS_DIR).is_dir() || path.join(METRICS_FILE).is_file(),
    }
}

/// Takes the run's lock, writing this process's id into it for the message
/// another process gets.
fn lock(dir: &Path) -> Result<File, TrainError> {
    let path = dir.join(LOCK_FILE);
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(TrainError::io(&path))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(fs::TryLockError::WouldBlock) => {
            let pid = fs::read_to_string(&path)
                .ok()
                .and_then(|s| s.trim().parse().ok());
            return Err(TrainError::RunInUse {
                dir: dir.to_path_buf(),
                pid,
            });
        }
        Err(fs::TryLockError::Error(e)) => return Err(TrainError::io(&path)(e)),
    }
    file.set_len(0).map_err(TrainError::io(&path))?;
    writeln!(file, "{}", std::process::id()).map_err(TrainError::io(&path))?;
    Ok(file)
}

/// The step a metrics line belongs to; `None` for a line that does not parse
/// (the torn last line of a killed process).
fn line_step(line: &str) -> Option<u64> {
    serde_json::from_str::<serde_json::Value>(line)
        .ok()?
        .get("step")?
        .as_u64()
}

/// The lines of `path` at or before `step`, and those after it (torn lines
/// are dropped).
fn split_metrics(path: &Path, step: u64) -> Result<(Vec<String>, Vec<String>), TrainError> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok((Vec::new(), Vec::new())),
        Err(e) => return Err(TrainError::io(path)(e)),
    };
    let (mut kept, mut cut) = (Vec::new(), Vec::new());
    for line in BufReader::new(file).lines() {
        let line = line.map_err(TrainError::io(path))?;
        match line_step(&line) {
            Some(s) if s <= step => kept.push(line),
            _ if line.trim().is_empty() => {}
            _ => cut.push(line),
        }
    }
    Ok((kept, cut))
}

fn write_lines(path: &Path, lines: &[String]) -> Result<(), TrainError> {
    let mut text = lines.join("\n");
    if !text.is_empty() {
        text.push('\n');
    }
    let mut f = File::create(path).map_err(TrainError::io(path))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(TrainError::io(path))
}

/// `20261202-101500` (UTC).
pub fn utc_stamp() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = i64::try_from(days).unwrap_or(0) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn of_many_claims_of_one_directory_exactly_one_wins() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("run");
        let results: Vec<bool> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| RunDir::claim(&target).map(std::mem::forget).is_ok()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(results.iter().filter(|&&ok| ok).count(), 1, "{results:?}");
    }

    #[test]
    fn an_empty_directory_can_be_claimed_a_used_one_cannot() {
        let dir = tempfile::tempdir().unwrap();
        let claimed = RunDir::claim(dir.path()).unwrap();
        let err = RunDir::open(dir.path()).unwrap_err();
        assert!(
            matches!(err, TrainError::RunInUse { pid: Some(_), .. }),
            "{err}"
        );
        drop(claimed);
        fs::write(dir.path().join(METRICS_FILE), "{}\n").unwrap();
        let err = RunDir::claim(dir.path()).unwrap_err();
        assert!(
            matches!(
                err,
                TrainError::RunDirTaken {
                    holds_run: true,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn metrics_are_cut_after_the_step_and_torn_lines_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(METRICS_FILE);
        fs::write(
            &path,
            "{\"kind\":\"train\",\"step\":1}\n{\"kind\":\"eval\",\"step\":2}\n\
             {\"kind\":\"train\",\"step\":3}\n{\"kind\":\"tra",
        )
        .unwrap();
        let (kept, cut) = split_metrics(&path, 2).unwrap();
        assert_eq!(kept.len(), 2);
        assert_eq!(
            cut,
            vec!["{\"kind\":\"train\",\"step\":3}", "{\"kind\":\"tra"]
        );
    }
}

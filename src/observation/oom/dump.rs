//! The OOM flight recorder: reports (and the history, while recording) written to a directory.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use super::OomReport;
use crate::allocators::observe;
use crate::history;

/// The directory OOM reports are written to (created if missing): `oom-<n>.json`, plus
/// `oom-<n>.history.json` and `oom-<n>.html` while history is recording. `<n>` is the first
/// number from 1 whose file does not exist yet, so processes sharing the directory do not
/// overwrite each other's dumps.
pub const OOM_DUMP_ENV: &str = "TENSORMEM_OOM_DUMP";

/// The most dumps one process writes (default 8); later reports are still delivered to
/// callbacks and `tracing`.
pub const OOM_DUMP_MAX_ENV: &str = "TENSORMEM_OOM_DUMP_MAX";

const DEFAULT_MAX_DUMPS: u64 = 8;

struct DumpConfig {
    dir: Option<PathBuf>,
    max: u64,
    written: u64,
    /// A failure to write was logged (it is logged once, not per OOM).
    failure_logged: bool,
}

/// `None` until the environment is read (on the first report) or [`set_dump_dir`] is called.
static CONFIG: Mutex<Option<DumpConfig>> = Mutex::new(None);

fn from_env() -> DumpConfig {
    let dir = std::env::var_os(OOM_DUMP_ENV).filter(|v| !v.is_empty()).map(PathBuf::from);
    let max = match std::env::var(OOM_DUMP_MAX_ENV) {
        Err(_) => DEFAULT_MAX_DUMPS,
        Ok(v) => v.trim().parse().unwrap_or_else(|_| {
            tracing::error!(
                target: "tensormem::oom",
                "{OOM_DUMP_MAX_ENV}={v:?} is not a whole number of dumps; writing at most {DEFAULT_MAX_DUMPS}"
            );
            DEFAULT_MAX_DUMPS
        }),
    };
    DumpConfig { dir, max, written: 0, failure_logged: false }
}

/// Writes OOM dumps to `dir` (`None`: none), at most `max_dumps` more of them, in place of what
/// [`OOM_DUMP_ENV`] and [`OOM_DUMP_MAX_ENV`] say. The directory is created at the first dump.
pub fn set_dump_dir(dir: Option<impl Into<PathBuf>>, max_dumps: u64) {
    crate::observation::hub::hub();
    let config = DumpConfig { dir: dir.map(Into::into), max: max_dumps, written: 0, failure_logged: false };
    observe::unobserved(|| *CONFIG.lock() = Some(config));
}

/// Writes `report` if a dump directory is set and the process has dumps left.
pub(super) fn write(report: &OomReport) {
    let mut guard = CONFIG.lock();
    let config = guard.get_or_insert_with(from_env);
    let Some(dir) = config.dir.clone() else { return };
    if config.written >= config.max {
        return;
    }
    match write_files(&dir, report) {
        Ok(()) => config.written += 1,
        Err(e) if !config.failure_logged => {
            config.failure_logged = true;
            tracing::error!(
                target: "tensormem::oom",
                dir = %dir.display(),
                "cannot write OOM dumps to {}: {e} (logged once; later OOMs are not dumped there either)",
                dir.display()
            );
        }
        Err(_) => {}
    }
}

fn write_files(dir: &Path, report: &OomReport) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    let (n, mut file) = claim(dir)?;
    file.write_all(report.to_json().as_bytes())?;
    if observe::recording() {
        let recorded = history::recorded();
        fs::write(dir.join(format!("oom-{n}.history.json")), recorded.to_json())?;
        fs::write(dir.join(format!("oom-{n}.html")), crate::timeline::render_html(&recorded))?;
    }
    Ok(())
}

/// Creates the first `oom-<n>.json` that does not exist yet.
fn claim(dir: &Path) -> io::Result<(u64, fs::File)> {
    for n in 1..=u64::from(u32::MAX) {
        match OpenOptions::new().write(true).create_new(true).open(dir.join(format!("oom-{n}.json"))) {
            Ok(file) => return Ok((n, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other("every oom-<n>.json name is taken"))
}

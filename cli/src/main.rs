//! `tensormem`: the command-line face of the tensormem memory layer.
//!
//! ```text
//! tensormem demo [--allocator NAME] [--serve ADDR] [--steps N] [--out DIR]
//! tensormem replay TRACE [--allocator NAME]...
//! tensormem tune TRACE [--max-slowdown F] [--jobs N]
//! tensormem import-torch SNAPSHOT.pickle -o TRACE.json [--device N] [--force]
//! tensormem timeline HISTORY.json -o OUT.html [--force]
//! tensormem pprof HISTORY.json -o OUT.pb.gz [--force]
//! tensormem summary SNAPSHOT.json
//! ```
//!
//! Errors are one line on stderr (`tensormem: error: ...`) and exit status 1; usage mistakes
//! exit with clap's status 2. A reader that closes standard output early (`| head -1`) ends the
//! command quietly with status 0; a failed write (a full disk) is an error.

mod demo;
mod files;
mod import_torch;
mod output;
mod replay;
mod tune;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::files::FileKind;
use crate::output::{Failure, flush_out, sayln, stdout_error};

/// The result of a subcommand: an error is one line for people.
pub(crate) type Outcome = Result<(), Failure>;

#[derive(Parser, Debug)]
#[command(
    name = "tensormem",
    version,
    about = "Memory layer for ML runtimes: demo, replay, tune, import-torch, timeline, pprof, summary"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Runs a small transformer-style inference loop on tensors through the registry's
    /// allocator, records its history, and writes history.json, timeline.html and snapshot.json.
    Demo(demo::DemoArgs),
    /// Replays a recorded allocation trace on allocators and prints the report.
    Replay(replay::ReplayArgs),
    /// Replays a trace over a grid of bfc and pool configurations, ranks them by peak reserved
    /// over peak requested, and prints the TENSORMEM_ALLOC_CONF line of the best one.
    Tune(tune::TuneArgs),
    /// Converts a PyTorch memory snapshot (`torch.cuda.memory._dump_snapshot`) into a trace for
    /// `replay` and `tune`.
    ImportTorch(import_torch::ImportArgs),
    /// Renders a history file (from `demo` or `tensormem::history`) as an HTML timeline.
    Timeline {
        /// The history file (JSON).
        history: PathBuf,
        /// Where to write the page (never the history itself; an existing file only with --force).
        #[arg(short = 'o', long = "out")]
        out: PathBuf,
        /// Overwrite OUT if it exists.
        #[arg(long)]
        force: bool,
    },
    /// Writes a history file as a pprof profile (gzipped protobuf: live bytes at the peak and
    /// bytes allocated, by allocation site) for `go tool pprof` and other pprof viewers.
    Pprof {
        /// The history file (JSON), recorded with backtraces for allocation sites.
        history: PathBuf,
        /// Where to write the profile (never the history itself; an existing file only with --force).
        #[arg(short = 'o', long = "out")]
        out: PathBuf,
        /// Overwrite OUT if it exists.
        #[arg(long)]
        force: bool,
    },
    /// Prints the memory summary of a snapshot file (`tensormem::telemetry::snapshot_json`).
    Summary {
        /// The snapshot file (JSON).
        snapshot: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage(&e),
    };
    let outcome = match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Replay(args) => replay::run(args),
        Command::Tune(args) => tune::run(args),
        Command::ImportTorch(args) => import_torch::run(args),
        Command::Timeline { history, out, force } => timeline(&history, &out, force),
        Command::Pprof { history, out, force } => pprof(&history, &out, force),
        Command::Summary { snapshot } => summary(&snapshot),
    };
    match outcome.and_then(|()| flush_out()) {
        Ok(()) | Err(Failure::PipeClosed) => ExitCode::SUCCESS,
        Err(Failure::Message(message)) => {
            eprintln!("tensormem: error: {}", message.replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}

/// Prints clap's help, version or usage error. Help and version go to standard output and
/// must reach it: a failed write is an error, as for every other output.
fn usage(e: &clap::Error) -> ExitCode {
    let written = e.print().map_err(|io| stdout_error(&io)).and_then(|()| flush_out());
    match written {
        Ok(()) | Err(Failure::PipeClosed) => ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2)),
        Err(Failure::Message(message)) => {
            eprintln!("tensormem: error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Reads the history at `history` for writing a file of another kind to `out`.
fn read_history(history: &Path, out: &Path, force: bool, what: &str) -> Result<tensormem::history::History, Failure> {
    let text = files::read(history)?;
    files::expect(history, &text, FileKind::History)?;
    let h = tensormem::history::History::from_json(&text).map_err(|e| format!("{}: {e}", history.display()))?;
    if same_file(history, out) {
        return Err(format!("{} is the history being read: choose another file for the {what}", out.display()).into());
    }
    if out.is_file() && !force {
        return Err(format!("{} exists: pass --force to overwrite it, or choose another file", out.display()).into());
    }
    Ok(h)
}

fn timeline(history: &Path, out: &Path, force: bool) -> Outcome {
    let h = read_history(history, out, force, "page")?;
    let html = tensormem::timeline::render_html(&h);
    std::fs::write(out, html).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    sayln!("{}: {h}; wrote {}", history.display(), out.display());
    Ok(())
}

fn pprof(history: &Path, out: &Path, force: bool) -> Outcome {
    let h = read_history(history, out, force, "profile")?;
    let with_sites = h.events.iter().filter(|e| e.backtrace.is_some()).count();
    std::fs::write(out, h.to_pprof()).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    sayln!(
        "{}: {h}; wrote {} ({with_sites} allocation sites from recorded backtraces; the rest by scope)",
        history.display(),
        out.display()
    );
    Ok(())
}

/// Whether `a` and `b` name the same existing file (through links, `..` or another spelling).
pub(crate) fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

fn summary(path: &Path) -> Outcome {
    let text = files::read(path)?;
    files::expect(path, &text, FileKind::Snapshot)?;
    let snap: tensormem::telemetry::MemorySnapshot =
        serde_json::from_str(&text).map_err(|e| format!("{}: not a tensormem memory snapshot: {e}", path.display()))?;
    snap.validate().map_err(|e| format!("{}: {e}", path.display()))?;
    output::say!("{}", tensormem::telemetry::summary_of(&snap, &[]));
    Ok(())
}

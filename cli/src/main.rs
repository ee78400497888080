//! `tensormem`: the command-line face of the tensormem memory layer.
//!
//! ```text
//! tensormem demo [--allocator NAME] [--serve ADDR] [--steps N] [--out DIR]
//! tensormem replay TRACE [--allocator NAME]...
//! tensormem timeline HISTORY.json -o OUT.html
//! tensormem summary SNAPSHOT.json
//! ```
//!
//! Errors are one line on stderr (`tensormem: error: ...`) and exit status 1; usage mistakes
//! exit with clap's status 2.

mod demo;
mod replay;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The result of a subcommand: an error is one line for people.
pub(crate) type Outcome = Result<(), String>;

#[derive(Parser, Debug)]
#[command(name = "tensormem", version, about = "Memory layer for ML runtimes: demo, replay, timeline, summary")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Runs a small transformer-style inference loop on tensors through the registry's
    /// allocator, records its history, and writes history.json and timeline.html.
    Demo(demo::DemoArgs),
    /// Replays a recorded allocation trace on allocators and prints the report.
    Replay(replay::ReplayArgs),
    /// Renders a history file (from `demo` or `tensormem::history`) as an HTML timeline.
    Timeline {
        /// The history file (JSON).
        history: PathBuf,
        /// Where to write the page.
        #[arg(short = 'o', long = "out")]
        out: PathBuf,
    },
    /// Prints the memory summary of a snapshot file (`tensormem::telemetry::snapshot_json`).
    Summary {
        /// The snapshot file (JSON).
        snapshot: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Replay(args) => replay::run(args),
        Command::Timeline { history, out } => timeline(&history, &out),
        Command::Summary { snapshot } => summary(&snapshot),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("tensormem: error: {}", message.replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}

fn timeline(history: &std::path::Path, out: &std::path::Path) -> Outcome {
    let h = tensormem::history::History::load(history).map_err(|e| match e {
        tensormem::history::HistoryError::Io { .. } => e.to_string(),
        _ => format!("{}: {e}", history.display()),
    })?;
    let html = tensormem::timeline::render_html(&h);
    std::fs::write(out, html).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    println!("{}: {h}; wrote {}", history.display(), out.display());
    Ok(())
}

fn summary(path: &std::path::Path) -> Outcome {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let snap: tensormem::telemetry::MemorySnapshot =
        serde_json::from_str(&text).map_err(|e| format!("{}: not a tensormem memory snapshot: {e}", path.display()))?;
    print!("{}", tensormem::telemetry::summary_of(&snap, &[]));
    Ok(())
}

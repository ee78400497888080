//! Writing to standard output as `cat` and `grep` do: a reader that goes away (a closed pipe,
//! `tensormem demo | head -1`) ends the command quietly; any other write error (a full disk,
//! `> /dev/full`) is one line and exit status 1.

use std::fmt;
use std::io::{self, Write};

/// Why a subcommand stopped.
#[derive(Debug)]
pub(crate) enum Failure {
    /// An error, as one line for people.
    Message(String),
    /// Standard output was closed by its reader: stop, say nothing.
    PipeClosed,
}

impl From<String> for Failure {
    fn from(message: String) -> Self {
        Self::Message(message)
    }
}

impl From<&str> for Failure {
    fn from(message: &str) -> Self {
        Self::Message(message.to_owned())
    }
}

/// A failed write to standard output, as a [`Failure`].
pub(crate) fn stdout_error(e: &io::Error) -> Failure {
    if e.kind() == io::ErrorKind::BrokenPipe {
        Failure::PipeClosed
    } else {
        Failure::Message(format!("cannot write to standard output: {e}"))
    }
}

/// Writes `args` to standard output, failing instead of panicking as `print!` does.
pub(crate) fn write_out(args: fmt::Arguments<'_>) -> Result<(), Failure> {
    io::stdout().lock().write_fmt(args).map_err(|e| stdout_error(&e))
}

/// Flushes standard output (what a line-buffered `print!` left).
pub(crate) fn flush_out() -> Result<(), Failure> {
    io::stdout().lock().flush().map_err(|e| stdout_error(&e))
}

/// `print!` that returns a [`Failure`] from the enclosing function instead of panicking.
macro_rules! say {
    ($($arg:tt)*) => { $crate::output::write_out(format_args!($($arg)*))? };
}

/// `println!` that returns a [`Failure`] from the enclosing function instead of panicking.
macro_rules! sayln {
    () => { $crate::output::write_out(format_args!("\n"))? };
    ($($arg:tt)*) => { $crate::output::write_out(format_args!("{}\n", format_args!($($arg)*)))? };
}

pub(crate) use {say, sayln};

/// A progress bar of `len` steps on standard error, drawn with `template` (indicatif's syntax),
/// ticking while a step runs.
pub(crate) fn progress_bar(len: u64, template: &str) -> Result<indicatif::ProgressBar, String> {
    let bar = indicatif::ProgressBar::with_draw_target(Some(len), indicatif::ProgressDrawTarget::stderr());
    let style = indicatif::ProgressStyle::with_template(template).map_err(|e| e.to_string())?;
    bar.set_style(style.progress_chars("=> "));
    bar.enable_steady_tick(std::time::Duration::from_millis(100));
    Ok(bar)
}

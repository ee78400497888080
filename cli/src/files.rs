//! The kinds of file the command reads, told apart so that a file given to the wrong
//! subcommand is named for what it is instead of failing on a field the other kind lacks.

use std::path::Path;

use crate::output::Failure;

/// A tensormem file kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FileKind {
    /// An allocation trace (`tensormem::AllocationTrace`): `replay` reads it.
    Trace,
    /// A history (`tensormem::history::History`): `timeline` reads it.
    History,
    /// A memory snapshot (`tensormem::telemetry::MemorySnapshot`): `summary` reads it.
    Snapshot,
}

impl FileKind {
    /// What it is, and the subcommand that reads it.
    fn described(self) -> &'static str {
        match self {
            Self::Trace => "an allocation trace (read it with `tensormem replay`)",
            Self::History => "a history file (draw it with `tensormem timeline`)",
            Self::Snapshot => "a memory snapshot (print it with `tensormem summary`)",
        }
    }

    /// The subcommand that reads it, and what it takes.
    fn taken_by(self) -> &'static str {
        match self {
            Self::Trace => "`replay` takes an allocation trace",
            Self::History => "`timeline` takes a history file",
            Self::Snapshot => "`summary` takes a memory snapshot",
        }
    }
}

/// Reads `path` as text.
pub(crate) fn read(path: &Path) -> Result<String, Failure> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()).into())
}

/// The kind of tensormem file `text` holds, told by its top-level fields; `None` for anything
/// else, including text that is not JSON (the reader of the expected kind then says what is
/// wrong with it).
pub(crate) fn kind_of(text: &str) -> Option<FileKind> {
    let serde_json::Value::Object(top) = serde_json::from_str(text).ok()? else { return None };
    let has = |k: &str| top.contains_key(k);
    if has("taken_at_unix_ms") && has("allocators") {
        Some(FileKind::Snapshot)
    } else if has("events") && has("start_unix_ms") && has("capacity") {
        Some(FileKind::History)
    } else if has("events") && has("description") {
        Some(FileKind::Trace)
    } else {
        None
    }
}

/// Refuses `text` when it is a tensormem file of another kind than `wanted`, naming both.
pub(crate) fn expect(path: &Path, text: &str, wanted: FileKind) -> Result<(), Failure> {
    match kind_of(text) {
        Some(found) if found != wanted => {
            Err(format!("{}: this is {}; {}", path.display(), found.described(), wanted.taken_by()).into())
        }
        _ => Ok(()),
    }
}

//! Backtraces as users read them: the frames of the capture machinery and of tensormem itself
//! are trimmed from the top, so that the first frame shown is the caller's code.

use std::backtrace::Backtrace;

/// Function-name prefixes of the frames trimmed from the top of a backtrace: the standard
/// library's capture code and tensormem's own crates (trait impls print as `<tensormem...`).
const LIBRARY_FRAMES: [&str; 8] = [
    "std::backtrace",
    "backtrace::",
    "tensormem::",
    "tensormem_allocators::",
    "tensormem_tensor::",
    "<tensormem::",
    "<tensormem_allocators::",
    "<tensormem_tensor::",
];

/// Prefixes of the standard library's generic glue (closures, `Option::map`, `FnOnce`): such a
/// frame between library frames is trimmed with them.
const GLUE_FRAMES: [&str; 6] = ["core::", "alloc::", "std::", "<core::", "<alloc::", "<std::"];

/// The source folders of tensormem's crates as they were built: an inlined frame is shown by
/// its bare name (`allocate_raw`), so its file tells whether it is the library's.
fn library_sources() -> [std::path::PathBuf; 2] {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    [root.join("src"), std::path::Path::new(crate::allocators::SOURCE_DIR).join("src")]
}

/// `bt` rendered as `Display` renders it, without the leading frames of the capture and of
/// tensormem (and the glue between them), numbered again from 0.
pub(crate) fn trimmed(bt: &Backtrace) -> String {
    let cwd = std::env::current_dir().unwrap_or_default();
    trim(&bt.to_string(), &cwd, &library_sources())
}

/// Trims `text`, a backtrace in `std::backtrace::Backtrace`'s format (a frame is a line
/// `  N: function` followed by `at file:line:column` lines; files under `cwd` shown as `./..`),
/// of the leading frames that are the library's: by name, or by a file under `sources`.
/// The frames of `text`, a backtrace in `Backtrace`'s format, innermost first: each function
/// name with the lines under it (its `at file:line:column` locations). `None` when `text` is not
/// a frame list (a disabled or unsupported backtrace).
pub(crate) fn frames(text: &str) -> Option<Vec<(String, Vec<&str>)>> {
    let mut frames: Vec<(String, Vec<&str>)> = Vec::new();
    for line in text.lines() {
        match line.trim_start().split_once(": ") {
            Some((n, function)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
                frames.push((function.to_owned(), Vec::new()));
            }
            _ => frames.last_mut()?.1.push(line),
        }
    }
    Some(frames)
}

pub(crate) fn trim(text: &str, cwd: &std::path::Path, sources: &[std::path::PathBuf]) -> String {
    // Not a frame list: kept as it is.
    let Some(frames) = frames(text) else { return text.to_owned() };
    let in_library = |rest: &[&str]| {
        rest.iter().filter_map(|l| l.trim_start().strip_prefix("at ")).next().is_some_and(|at| {
            let file = at.split(':').next().unwrap_or(at);
            let file = match file.strip_prefix("./") {
                Some(relative) => cwd.join(relative),
                None => std::path::PathBuf::from(file),
            };
            sources.iter().any(|s| file.starts_with(s))
        })
    };
    let first = frames
        .iter()
        .position(|(f, rest)| {
            let library = LIBRARY_FRAMES.iter().any(|p| f.starts_with(p)) || in_library(rest);
            let glue = GLUE_FRAMES.iter().any(|p| f.starts_with(p));
            !library && !glue
        })
        .unwrap_or(0);
    let mut out = String::new();
    for (i, (function, rest)) in frames[first..].iter().enumerate() {
        out.push_str(&format!("{i:>4}: {function}\n"));
        for line in rest {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::trim;

    #[test]
    fn library_frames_are_trimmed_from_the_top_and_the_rest_renumbered() {
        let bt = "   0: std::backtrace_rs::backtrace::libunwind::trace\n             at /rustc/x/backtrace.rs:1:1\n   \
                  1: std::backtrace::Backtrace::create\n   \
                  2: tensormem::observation::hub::Hub::on_event\n             at ./src/observation/hub.rs:73:5\n   \
                  3: core::bool::<impl bool>::then\n             at /rustc/x/bool.rs:66:24\n   \
                  4: <tensormem_allocators::system::SystemAllocator as tensormem_allocators::allocator::Allocator>::allocate_raw\n   \
                  5: allocate_raw\n             at ./allocators/src/backends/system.rs:99:22\n   \
                  6: leaky_helper\n             at ./tests/leak.rs:9:9\n   \
                  7: my_engine::load_weights\n             at ./src/main.rs:10:5\n   \
                  8: main\n";
        let sources = [PathBuf::from("/lib/src"), PathBuf::from("/lib/allocators/src")];
        let t = trim(bt, Path::new("/lib"), &sources);
        assert!(t.starts_with("   0: leaky_helper\n             at ./tests/leak.rs:9:9\n"), "{t}");
        assert!(t.contains("   1: my_engine::load_weights\n"), "frames below the caller stay: {t}");
        assert!(!t.contains("Backtrace::create") && !t.contains("allocate_raw"), "{t}");
        // The same user frame elsewhere: only the library's folders are trimmed.
        let t = trim(bt, Path::new("/user"), &sources);
        assert!(t.starts_with("   0: allocate_raw\n"), "{t}");
    }

    #[test]
    fn text_that_is_not_a_frame_list_is_kept() {
        assert_eq!(trim("disabled backtrace", Path::new("/"), &[]), "disabled backtrace");
        assert_eq!(trim("", Path::new("/"), &[]), "");
    }
}

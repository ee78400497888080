//! Human-readable byte sizes for error messages and reports.

use core::fmt;

/// Displays a byte count in binary units with one decimal: `512 B`, `1.5 KiB`, `3.0 MiB`.
///
/// ```
/// use tensormem_allocators::ByteSize;
/// assert_eq!(ByteSize(512).to_string(), "512 B");
/// assert_eq!(ByteSize(1536).to_string(), "1.5 KiB");
/// assert_eq!(ByteSize(3 << 30).to_string(), "3.0 GiB");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
        let mut unit = 0;
        let mut scaled = self.0 as f64;
        while scaled >= 1024.0 && unit + 1 < UNITS.len() {
            scaled /= 1024.0;
            unit += 1;
        }
        if unit == 0 { write!(f, "{} B", self.0) } else { write!(f, "{scaled:.1} {}", UNITS[unit]) }
    }
}

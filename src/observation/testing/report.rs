//! [`LeakReport`]: what a leak check found still live.

use core::fmt;

use crate::allocators::ByteSize;
use crate::observation::hub::hub;

/// One allocation still live when its check finished.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Leak {
    /// The allocation's id: unique in the process, increasing in allocation order.
    pub allocation_id: u64,
    /// Its address.
    pub address: usize,
    /// The size asked for.
    pub requested_size: usize,
    /// The size the allocator set aside (size class, rounded chunk).
    pub allocated_size: usize,
    /// The allocator that served it.
    pub allocator: String,
    /// The scope it was allocated in.
    pub tag: Option<String>,
    /// For a tensor's storage, the tensor that created it (`tensor f32 [2, 3]`).
    pub tensor: Option<String>,
    /// Where it was allocated, when `TENSORMEM_BACKTRACE=1`.
    pub backtrace: Option<String>,
}

/// What a [`LeakCheck`](super::LeakCheck) found: every allocation attributed to it and still
/// live, oldest first. `Display` prints a table.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LeakReport {
    /// The leaks, oldest first.
    pub leaks: Vec<Leak>,
    /// The most bytes (requested sizes) that the check's allocations held at once, freed or
    /// not: the check's thread(s)' peak, for memory budgets (see
    /// [`assert_peak_below`](super::assert_peak_below)).
    #[serde(default)]
    pub peak_bytes: u64,
}

impl LeakReport {
    /// No leaks.
    pub fn is_empty(&self) -> bool {
        self.leaks.is_empty()
    }

    /// Requested bytes leaked in all.
    pub fn leaked_bytes(&self) -> usize {
        self.leaks.iter().map(|l| l.requested_size).sum()
    }

    /// The peak bytes the check's allocations held at once (the [field](Self::peak_bytes)).
    pub fn peak_bytes(&self) -> u64 {
        self.peak_bytes
    }
}

/// The live records of check `id`, oldest first.
pub(super) fn collect(id: u64, peak_bytes: u64) -> LeakReport {
    let mut leaks: Vec<Leak> = hub()
        .records
        .iter()
        .filter(|r| r.checks.contains(&id))
        .map(|r| Leak {
            allocation_id: r.id,
            address: *r.key(),
            requested_size: r.requested,
            allocated_size: r.allocated,
            allocator: r.allocator.as_str().to_owned(),
            tag: r.tag.map(|t| t.as_str().to_owned()),
            tensor: r.description.as_deref().map(str::to_owned),
            backtrace: r.backtrace.as_deref().map(crate::observation::backtrace::trimmed),
        })
        .collect();
    leaks.sort_by_key(|l| l.allocation_id);
    LeakReport { leaks, peak_bytes }
}

impl fmt::Display for LeakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.leaks.is_empty() {
            return writeln!(f, "no leaks");
        }
        writeln!(
            f,
            "{} leaked allocation(s), {} requested (peak {}):",
            self.leaks.len(),
            ByteSize(self.leaked_bytes() as u64),
            ByteSize(self.peak_bytes)
        )?;
        let rows: Vec<Vec<String>> = self
            .leaks
            .iter()
            .map(|l| {
                vec![
                    l.allocation_id.to_string(),
                    l.requested_size.to_string(),
                    l.allocated_size.to_string(),
                    l.allocator.clone(),
                    l.tag.clone().unwrap_or_else(|| "-".into()),
                    l.tensor.clone().unwrap_or_else(|| "-".into()),
                ]
            })
            .collect();
        let header = ["id", "requested", "allocated", "allocator", "scope", "tensor"];
        let lines = crate::text_table::lines(&header, &rows, &[false, false, false, true, true, true]);
        writeln!(f, "{}", lines[0])?;
        for (line, leak) in lines[1..].iter().zip(&self.leaks) {
            writeln!(f, "{line}")?;
            if let Some(bt) = &leak.backtrace {
                for frame in bt.lines() {
                    writeln!(f, "      {frame}")?;
                }
            }
        }
        Ok(())
    }
}

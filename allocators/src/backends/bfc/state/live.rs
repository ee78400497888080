//! [`LiveBlocks`]: the chunk of every block handed out, by its address.
//!
//! TensorFlow's BFC keeps, per region, one handle for every 256 bytes of it (`handles_`), so
//! that a free finds its chunk by indexing, and updates it on every split and merge. That table
//! is host memory in proportion to the memory managed, not to what is in it: 4 bytes per 256
//! (216 MB for the 13.5 GB the GPT-2 training stream commits, more while the vector doubles),
//! written in full each time the region grows, and each free touches a page of it far from the
//! last one. PyTorch's caching allocator keeps a hash set of its allocated blocks instead; so
//! does this: one entry per live block (hundreds to thousands on the recorded streams), one
//! insertion when a block is handed out and one removal when it comes back. Free chunks are
//! found through their neighbours' links and the free indexes, never by address.

use super::Handle;
use crate::word_map::WordMap;

/// The chunk of every block handed out, by the block's address.
#[derive(Debug, Default)]
pub(super) struct LiveBlocks(WordMap<usize, Handle>);

impl LiveBlocks {
    /// Records the block at `ptr`, held by chunk `h`.
    pub(super) fn insert(&mut self, ptr: usize, h: Handle) {
        let earlier = self.0.insert(ptr, h);
        debug_assert!(earlier.is_none(), "two live blocks at {ptr:#x}");
    }

    /// The chunk of the live block at `ptr`.
    pub(super) fn get(&self, ptr: usize) -> Option<Handle> {
        self.0.get(&ptr).copied()
    }

    /// Takes out the live block at `ptr` (it is being freed) and returns its chunk; `None`
    /// (and nothing changed) when no live block starts there.
    pub(super) fn take(&mut self, ptr: usize) -> Option<Handle> {
        self.0.remove(&ptr)
    }

    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    pub(super) fn clear(&mut self) {
        self.0.clear();
    }

    /// Gives back the map's spare capacity (left by an earlier peak of live blocks).
    pub(super) fn shrink(&mut self) {
        self.0.shrink_to_fit();
    }

    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.0.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: usize = 0x7f00_0000_0000;

    #[test]
    fn insert_get_take() {
        let mut live = LiveBlocks::default();
        for i in 0..10_000u32 {
            live.insert(BASE + i as usize * 256, i);
        }
        assert_eq!(live.len(), 10_000);
        assert_eq!(live.get(BASE + 4321 * 256), Some(4321));
        assert_eq!(live.get(BASE + 4321 * 256 + 8), None, "inside a block");
        assert_eq!(live.take(BASE + 4321 * 256), Some(4321));
        assert_eq!(live.take(BASE + 4321 * 256), None, "already taken");
        assert_eq!((live.get(BASE + 4321 * 256), live.len()), (None, 9_999));
        live.shrink();
        assert!(live.capacity() >= 9_999);
        live.clear();
        assert_eq!(live.len(), 0);
        live.shrink();
        assert!(live.capacity() < 16, "{} slots kept for no live block", live.capacity());
    }
}

//! Property tests: random allocate/free sequences through the BFC allocator, checked against a
//! simple model after every step.

use std::alloc::Layout;
use std::ptr::NonNull;

use proptest::prelude::*;
use tensormem_allocators::{AllocationAttributes, Allocator, BfcAllocator};

#[derive(Clone, Debug)]
enum Op {
    Alloc { size: usize, align_shift: u32 },
    Free { pick: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1usize..200_000, 0u32..13).prop_map(|(size, align_shift)| Op::Alloc { size, align_shift }),
        2 => any::<usize>().prop_map(|pick| Op::Free { pick }),
    ]
}

struct Live {
    ptr: NonNull<u8>,
    layout: Layout,
    allocated: usize,
}

fn check_model(bfc: &BfcAllocator, live: &[Live], peak: u64) -> Result<(), TestCaseError> {
    bfc.check_invariants().map_err(TestCaseError::fail)?;
    let dump = bfc.memory_dump();
    let mut spans: Vec<(usize, usize)> = live.iter().map(|l| (l.ptr.as_ptr() as usize, l.allocated)).collect();
    spans.sort();
    for w in spans.windows(2) {
        prop_assert!(w[0].0 + w[0].1 <= w[1].0, "live blocks overlap: {:?}", w);
    }
    for &(p, n) in &spans {
        prop_assert!(
            dump.regions.iter().any(|r| r.base <= p && p + n <= r.base + r.size),
            "block {p:#x}+{n} outside every region"
        );
    }
    for l in live {
        prop_assert_eq!(l.ptr.as_ptr() as usize % l.layout.align(), 0);
        prop_assert_eq!(bfc.requested_size(l.ptr), Some(l.layout.size()));
    }
    let s = bfc.stats().unwrap();
    prop_assert_eq!(s.bytes_in_use, live.iter().map(|l| l.allocated as u64).sum::<u64>());
    prop_assert_eq!(s.peak_bytes_in_use, peak);
    prop_assert!(s.bytes_reserved <= 32 << 20);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_sequences_keep_every_invariant(ops in prop::collection::vec(op(), 1..300), growth in any::<bool>()) {
        let bfc = BfcAllocator::builder().memory_limit(32 << 20).allow_growth(growth).build().unwrap();
        let mut live: Vec<Live> = Vec::new();
        let mut peak = 0u64;
        for op in ops {
            match op {
                Op::Alloc { size, align_shift } => {
                    let layout = Layout::from_size_align(size, 1 << align_shift).unwrap();
                    match bfc.allocate_raw(layout, &AllocationAttributes::default()) {
                        Ok(ptr) => {
                            let allocated = bfc.allocated_size(ptr).unwrap();
                            prop_assert!(allocated >= size && allocated % 256 == 0);
                            // The memory is really ours: write its ends (the last byte first,
                            // so that a 1-byte block keeps the first byte's marker).
                            // SAFETY: `ptr` is valid for `size` bytes.
                            unsafe {
                                ptr.as_ptr().add(size - 1).write(0x5A);
                                ptr.as_ptr().write(0xA5);
                            }
                            live.push(Live { ptr, layout, allocated });
                            peak = peak.max(live.iter().map(|l| l.allocated as u64).sum());
                        }
                        Err(e) => {
                            // Only for lack of room: the request plus what is live must not
                            // fit in the largest free block.
                            prop_assert!(e.largest_free_block().unwrap() < (size as u64).next_multiple_of(256) + (1 << align_shift));
                        }
                    }
                }
                Op::Free { pick } => {
                    if !live.is_empty() {
                        let l = live.swap_remove(pick % live.len());
                        // SAFETY: the block is live and freed once with its layout.
                        unsafe {
                            prop_assert_eq!(l.ptr.as_ptr().read(), 0xA5);
                            bfc.deallocate_raw(l.ptr, l.layout);
                        }
                    }
                }
            }
            check_model(&bfc, &live, peak)?;
        }
        for l in live.drain(..) {
            // SAFETY: freed once with its layout.
            unsafe { bfc.deallocate_raw(l.ptr, l.layout) };
        }
        check_model(&bfc, &live, peak)?;
        let dump = bfc.memory_dump();
        // Every region is one free chunk again.
        prop_assert_eq!(dump.chunks.len(), dump.regions.len());
        prop_assert!(dump.chunks.iter().all(|c| !c.in_use && c.offset == 0));
    }
}

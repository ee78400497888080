//! `TENSORMEM_BACKTRACE=1`: each leak carries the backtrace of its allocation. In a test binary
//! of its own, because it sets an environment variable.

use tensormem::testing::LeakCheck;
use tensormem::{AllocatorExt, SystemAllocator};

#[inline(never)]
fn leaky_helper(cpu: &SystemAllocator) -> std::ptr::NonNull<u8> {
    cpu.allocate::<u8>(321).unwrap()
}

#[test]
fn backtraces_are_captured_only_when_asked() {
    let cpu = SystemAllocator::new();
    let check = LeakCheck::start();
    let p = leaky_helper(&cpu);
    let without = check.finish();
    assert_eq!(without.leaks[0].backtrace, None);
    // SAFETY: this binary has one test and sets the variable before any other thread reads the
    // environment.
    unsafe { std::env::set_var("TENSORMEM_BACKTRACE", "1") };
    let check = LeakCheck::start();
    let q = leaky_helper(&cpu);
    let with = check.finish();
    let bt = with.leaks[0].backtrace.as_deref().expect("a backtrace");
    assert!(bt.contains("leaky_helper"), "{bt}");
    // tensormem's own frames (and the capture's) are trimmed: the caller's frame comes first.
    let first = bt.lines().next().unwrap_or_default();
    assert!(first.trim_start().starts_with("0: ") && first.contains("leaky_helper"), "{bt}");
    assert!(!bt.contains("tensormem_allocators::") && !bt.contains("Backtrace::create"), "{bt}");
    assert!(with.to_string().contains("leaky_helper"), "the table shows it too");
    // SAFETY: both came from `allocate::<u8>(321)` on `cpu`.
    unsafe {
        cpu.deallocate(p, 321);
        cpu.deallocate(q, 321);
    }
}

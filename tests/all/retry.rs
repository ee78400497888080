//! RetryAllocator: waiting for frees, giving up after the maximum wait, and failing at once
//! without retry_on_failure.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tensormem::{AllocErrorKind, AllocationAttributes, Allocator, BfcAllocator, RetryAllocator};

fn setup(max_wait: Duration) -> (Arc<RetryAllocator>, Layout) {
    let bfc = Arc::new(BfcAllocator::builder().memory_limit(1 << 20).build().unwrap());
    (Arc::new(RetryAllocator::new(bfc).with_max_wait(max_wait)), Layout::from_size_align(600 << 10, 8).unwrap())
}

#[test]
fn a_blocked_allocation_succeeds_once_another_thread_frees() {
    let (retry, big) = setup(Duration::from_secs(10));
    let held = retry.allocate_raw(big, &AllocationAttributes::default()).unwrap();
    let start = Instant::now();
    let freer = {
        let (retry, held) = (Arc::clone(&retry), held.as_ptr() as usize);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            // SAFETY: freed once with its layout.
            unsafe { retry.deallocate_raw(NonNull::new(held as *mut u8).unwrap(), big) };
        })
    };
    let p = retry.allocate_raw(big, &AllocationAttributes::default()).unwrap();
    let waited = start.elapsed();
    freer.join().unwrap();
    assert!(waited >= Duration::from_millis(140), "returned before the free: {waited:?}");
    assert!(waited < Duration::from_secs(5), "missed the free's notification: {waited:?}");
    let s = retry.stats().unwrap();
    assert!(s.num_alloc_retries >= 1);
    assert_eq!(s.num_ooms, 0);
    // SAFETY: freed once with its layout.
    unsafe { retry.deallocate_raw(p, big) };
}

#[test]
fn without_retry_on_failure_it_fails_at_once() {
    let (retry, big) = setup(Duration::from_secs(10));
    let held = retry.allocate_raw(big, &AllocationAttributes::default()).unwrap();
    let start = Instant::now();
    let err = retry.allocate_raw(big, &AllocationAttributes::NO_RETRY).unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(5), "it waited out part of the 10 s retry");
    assert_eq!(err.kind(), AllocErrorKind::OutOfMemory);
    let s = retry.stats().unwrap();
    assert_eq!((s.num_alloc_retries, s.num_ooms), (0, 1));
    // SAFETY: freed once with its layout.
    unsafe { retry.deallocate_raw(held, big) };
}

#[test]
fn it_gives_up_after_the_maximum_wait() {
    let (retry, big) = setup(Duration::from_millis(200));
    let held = retry.allocate_raw(big, &AllocationAttributes::default()).unwrap();
    let start = Instant::now();
    let err = retry.allocate_raw(big, &AllocationAttributes::default()).unwrap_err();
    let waited = start.elapsed();
    assert!(waited >= Duration::from_millis(190) && waited < Duration::from_secs(5), "{waited:?}");
    assert_eq!(err.kind(), AllocErrorKind::OutOfMemory);
    assert!(err.to_string().contains("in use of a 1.0 MiB limit"), "{err}");
    assert_eq!(retry.stats().unwrap().num_ooms, 1);
    // SAFETY: freed once with its layout.
    unsafe { retry.deallocate_raw(held, big) };
}

#[test]
fn frees_that_do_not_make_room_keep_it_waiting() {
    let (retry, _) = setup(Duration::from_secs(10));
    let small = Layout::from_size_align(100 << 10, 8).unwrap();
    let big = Layout::from_size_align(900 << 10, 8).unwrap();
    let smalls: Vec<usize> = (0..5)
        .map(|_| retry.allocate_raw(small, &AllocationAttributes::default()).unwrap().as_ptr() as usize)
        .collect();
    let start = Instant::now();
    let freer = {
        let retry = Arc::clone(&retry);
        std::thread::spawn(move || {
            for p in smalls {
                std::thread::sleep(Duration::from_millis(40));
                // SAFETY: each freed once with its layout.
                unsafe { retry.deallocate_raw(NonNull::new(p as *mut u8).unwrap(), small) };
            }
        })
    };
    // 900 KiB fits only once all five 100 KiB blocks are gone.
    let p = retry.allocate_raw(big, &AllocationAttributes::default()).unwrap();
    assert!(start.elapsed() >= Duration::from_millis(190));
    freer.join().unwrap();
    assert!(retry.stats().unwrap().num_alloc_retries >= 2);
    // SAFETY: freed once with its layout.
    unsafe { retry.deallocate_raw(p, big) };
}

#[test]
fn only_real_shortages_count_as_ooms_and_the_inner_count_is_not_replaced() {
    let (retry, big) = setup(Duration::from_millis(50));
    // An alignment the BFC cannot honour: refused at once, not an OOM.
    let odd = Layout::from_size_align(64, 1 << 20).unwrap();
    let err = retry.allocate_raw(odd, &AllocationAttributes::default()).unwrap_err();
    assert_eq!(err.kind(), AllocErrorKind::UnsupportedLayout);
    assert_eq!(retry.stats().unwrap().num_ooms, 0);
    let held = retry.allocate_raw(big, &AllocationAttributes::default()).unwrap();
    assert!(retry.allocate_raw(big, &AllocationAttributes::NO_RETRY).is_err());
    let s = retry.stats().unwrap();
    assert_eq!(s.num_ooms, 1, "one request finally failed");
    assert_eq!(retry.wrapped().stats().unwrap().num_ooms, 1, "the BFC refused it once");
    // SAFETY: freed once with its layout.
    unsafe { retry.deallocate_raw(held, big) };
}

#[test]
fn a_request_larger_than_the_whole_limit_fails_at_once() {
    let (retry, _) = setup(Duration::from_secs(30));
    let start = Instant::now();
    let err =
        retry.allocate_raw(Layout::from_size_align(2 << 20, 8).unwrap(), &AllocationAttributes::default()).unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(10), "it waited {:?} for the impossible", start.elapsed());
    assert_eq!(err.kind(), AllocErrorKind::LimitExceeded);
    assert_eq!(retry.stats().unwrap().num_alloc_retries, 0);
}

#[test]
fn an_endless_maximum_wait_is_saturated_not_a_panic() {
    let (retry, big) = setup(Duration::MAX);
    let held = retry.allocate_raw(big, &AllocationAttributes::default()).unwrap();
    let freer = {
        let (retry, held) = (Arc::clone(&retry), held.as_ptr() as usize);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            // SAFETY: freed once with its layout.
            unsafe { retry.deallocate_raw(NonNull::new(held as *mut u8).unwrap(), big) };
        })
    };
    let p = retry.allocate_raw(big, &AllocationAttributes::default()).unwrap();
    freer.join().unwrap();
    // SAFETY: freed once with its layout.
    unsafe { retry.deallocate_raw(p, big) };
}

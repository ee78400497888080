//! TENSORMEM_ALLOCATOR picks the global allocator. Each case runs this binary again as a child
//! process with the variable set, because the global registry reads it once per process.

use std::process::{Command, ExitCode};

use tensormem::{AllocatorRegistry, RegistryError};

const CHILD: &str = "TENSORMEM_TEST_CHILD";

/// What is checked, `TENSORMEM_ALLOCATOR`, `TENSORMEM_ALLOC_CONF`, and the allocator chosen or
/// the error expected.
type Case<'a> = (&'a str, Option<&'a str>, Option<&'a str>, Result<&'a str, &'a str>);

/// The registry entries of the machine's CUDA devices (feature `cuda`), listed after the host
/// allocators: `, cuda:0, cuda_async:0, cuda_host` on a one-device machine, nothing without one.
fn device_entries() -> String {
    #[cfg(feature = "cuda")]
    return (0..tensormem::allocators::cuda::device_count())
        .map(|n| format!(", cuda:{n}, cuda_async:{n}{}", if n == 0 { ", cuda_host" } else { "" }))
        .collect();
    #[cfg(not(feature = "cuda"))]
    String::new()
}

fn main() -> ExitCode {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    let host =
        if cfg!(all(feature = "jemalloc", not(target_env = "msvc"))) { "pool, jemalloc, cpu" } else { "pool, cpu" };
    let registered = format!("{host}{}", device_entries());
    let unknown = format!(
        "TENSORMEM_ALLOCATOR: no allocator named 'tpu' is registered (registered: \
         {registered}; can be configured: bfc (configure it with TENSORMEM_ALLOC_CONF=bfc.memory_limit=<size>); \
         names are compared case-insensitively)"
    );
    let bad_size = format!(
        "TENSORMEM_ALLOC_CONF: bad value '1.5G' for pool.size_limit: expected a size such as 256MiB ({})",
        tensormem::SIZE_SPELLINGS
    );
    let cases: Vec<Case<'_>> = vec![
        ("unset chooses by priority: the pool", None, None, Ok("pool")),
        ("empty counts as unset", Some(""), None, Ok("pool")),
        ("a registered name wins over priorities", Some("cpu"), None, Ok("cpu")),
        ("names compare case-insensitively", Some("CPU"), None, Ok("cpu")),
        ("an unknown name is an error listing the registered and configurable names", Some("tpu"), None, Err(&unknown)),
        ("the pool is always there", Some("pool"), None, Ok("pool")),
        ("bfc is there once configured", Some("bfc"), Some("bfc.memory_limit=64MiB,bfc.allow_growth=true"), Ok("bfc")),
        ("configuring bfc chooses it", None, Some("bfc.memory_limit=64MiB"), Ok("bfc")),
        ("a configured bfc can still be passed over by name", Some("pool"), Some("bfc.memory_limit=64MiB"), Ok("pool")),
        (
            "a bfc limit of 0 names the key and the rule",
            None,
            Some("bfc.memory_limit=0"),
            Err("TENSORMEM_ALLOC_CONF: bfc.memory_limit=0: the bfc allocator needs a positive limit (at least 256 B, \
                 one chunk)"),
        ),
        ("choosing bfc without its limit limits it to the machine's memory", Some("bfc"), None, Ok("bfc")),
        (
            "a misspelt key is reported, not ignored",
            None,
            Some("bfc.memory_limt=1GiB"),
            Err(
                "TENSORMEM_ALLOC_CONF: unknown key 'bfc.memory_limt' (known keys: bfc.memory_limit, bfc.allow_growth, \
                 bfc.expandable, bfc.growth_granule, bfc.split, bfc.release_threshold, bfc.first_fit_above, \
                 bfc.peak_headroom, bfc.garbage_collection, bfc.max_internal_fragmentation, bfc.huge_pages, \
                 pool.size_limit, pool.rounding, pool.auto_resize, pool.large_threshold, pool.huge_pages, \
                 cuda.memory_limit, cuda.memory_fraction, cuda_async.release_threshold)",
            ),
        ),
        ("a bad size is reported with its key", Some("pool"), Some("pool.size_limit=1.5G"), Err(&bad_size)),
        (
            "a device memory fraction outside (0, 1] is an error, with or without a GPU",
            None,
            Some("cuda.memory_fraction=1.5"),
            Err(
                "TENSORMEM_ALLOC_CONF: bad value '1.5' for cuda.memory_fraction: expected a number in (0, 1]: the share \
                 of each device's total memory its cuda:N allocator may use",
            ),
        ),
    ];
    let exe = std::env::current_exe().expect("the test binary's path");
    let (mut passed, mut failed) = (0, 0);
    for (what, value, conf, expected) in cases {
        let mut cmd = Command::new(&exe);
        cmd.env(CHILD, "1");
        match value {
            Some(v) => cmd.env("TENSORMEM_ALLOCATOR", v),
            None => cmd.env_remove("TENSORMEM_ALLOCATOR"),
        };
        match conf {
            Some(v) => cmd.env("TENSORMEM_ALLOC_CONF", v),
            None => cmd.env_remove("TENSORMEM_ALLOC_CONF"),
        };
        let out = cmd.output().expect("running the child");
        let stdout = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let want = match expected {
            Ok(name) => format!("ok {name}"),
            Err(msg) => format!("err {msg}\npanic {msg}"),
        };
        if out.status.success() && stdout == want {
            passed += 1;
            println!("test {what} ... ok");
        } else {
            failed += 1;
            println!("test {what} ... FAILED\n  expected: {want:?}\n  got:      {stdout:?} ({})", out.status);
        }
    }
    println!("test result: {}. {passed} passed; {failed} failed", if failed == 0 { "ok" } else { "FAILED" });
    if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// Reports what the global registry chose, on stdout.
fn child() -> ExitCode {
    let g = AllocatorRegistry::global();
    match g.try_get() {
        Ok(a) => {
            assert_eq!(g.get().name(), a.name());
            println!("ok {}", a.name());
        }
        Err(e) => {
            assert!(matches!(e, RegistryError::UnknownAllocator { .. } | RegistryError::Config(_)), "{e:?}");
            println!("err {e}");
            std::panic::set_hook(Box::new(|_| {}));
            let panic = std::panic::catch_unwind(|| g.get()).expect_err("get() must panic");
            println!("panic {}", panic.downcast_ref::<String>().map_or("?", |s| s.as_str()));
        }
    }
    ExitCode::SUCCESS
}

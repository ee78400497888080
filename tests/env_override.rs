//! TENSORMEM_ALLOCATOR picks the global allocator. Each case runs this binary again as a child
//! process with the variable set, because the global registry reads it once per process.

use std::process::{Command, ExitCode};

use tensormem::{AllocatorRegistry, RegistryError};

const CHILD: &str = "TENSORMEM_TEST_CHILD";

fn main() -> ExitCode {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    let default = if cfg!(feature = "jemalloc") { "jemalloc" } else { "cpu" };
    let cases: [(&str, Option<&str>, Result<&str, &str>); 4] = [
        ("unset chooses by priority", None, Ok(default)),
        ("empty counts as unset", Some(""), Ok(default)),
        ("a registered name wins over priorities", Some("cpu"), Ok("cpu")),
        (
            "an unknown name is an error listing the registered names",
            Some("tpu"),
            Err(if cfg!(feature = "jemalloc") {
                "TENSORMEM_ALLOCATOR selects allocator 'tpu', but no allocator of that name is registered (registered: jemalloc, cpu)"
            } else {
                "TENSORMEM_ALLOCATOR selects allocator 'tpu', but no allocator of that name is registered (registered: cpu)"
            }),
        ),
    ];
    let exe = std::env::current_exe().expect("the test binary's path");
    let (mut passed, mut failed) = (0, 0);
    for (what, value, expected) in cases {
        let mut cmd = Command::new(&exe);
        cmd.env(CHILD, "1");
        match value {
            Some(v) => cmd.env("TENSORMEM_ALLOCATOR", v),
            None => cmd.env_remove("TENSORMEM_ALLOCATOR"),
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
            assert!(matches!(e, RegistryError::UnknownAllocator { .. }), "{e:?}");
            println!("err {e}");
            std::panic::set_hook(Box::new(|_| {}));
            let panic = std::panic::catch_unwind(|| g.get()).expect_err("get() must panic");
            println!("panic {}", panic.downcast_ref::<String>().map_or("?", |s| s.as_str()));
        }
    }
    ExitCode::SUCCESS
}

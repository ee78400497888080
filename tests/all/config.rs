//! TENSORMEM_ALLOC_CONF parsing: sizes, flags, and errors that name the key.

use tensormem::{
    AllocConf, Allocator, AllocatorExt, BfcAllocator, ConfigError, SizeRounding, SystemAllocator, parse_size,
};

#[test]
fn the_documented_example_parses() {
    let c = AllocConf::parse("bfc.memory_limit=4GiB,bfc.allow_growth=true,pool.size_limit=256MiB").unwrap();
    assert_eq!(
        c,
        AllocConf {
            bfc_memory_limit: Some(4 << 30),
            bfc_allow_growth: Some(true),
            pool_size_limit: Some(256 << 20),
            ..AllocConf::default()
        }
    );
    assert!(c.configures_bfc());
    assert_eq!(AllocConf::parse("").unwrap(), AllocConf::default());
    assert_eq!(AllocConf::parse(" , ").unwrap(), AllocConf::default());
}

#[test]
fn every_key_and_unit() {
    let c = AllocConf::parse(
        " bfc.memory_limit = 512MiB , bfc.garbage_collection=off, bfc.max_internal_fragmentation=1KiB, \
         pool.rounding=multiple:4KiB, pool.auto_resize=false",
    )
    .unwrap();
    assert_eq!(c.bfc_memory_limit, Some(512 << 20));
    assert_eq!(c.bfc_garbage_collection, Some(false));
    assert_eq!(c.bfc_max_internal_fragmentation, Some(1024));
    assert_eq!(c.pool_rounding, Some(SizeRounding::Multiple(4096)));
    assert_eq!(c.pool_auto_resize, Some(false));
    for (text, bytes) in [
        ("17", 17),
        ("17B", 17),
        ("3kib", 3072),
        ("2GiB", 2 << 30),
        ("1TiB", 1 << 40),
        ("1.5GiB", 3 << 29),
        ("0.5 KiB", 512),
        ("4GB", 4_000_000_000),
        ("4 MB", 4_000_000),
        ("1.5kb", 1500),
        ("2TB", 2_000_000_000_000),
        (".5MiB", 1 << 19),
    ] {
        assert_eq!(parse_size(text), Some(bytes), "{text}");
    }
    for bad in ["", "MiB", "4G", "4M", "1.2.3GiB", ".", "-1", "99999999999999999999", "16777216TiB", "1e9"] {
        assert_eq!(parse_size(bad), None, "{bad}");
    }
    assert_eq!(AllocConf::parse("pool.rounding=exact").unwrap().pool_rounding, Some(SizeRounding::Exact));
}

#[test]
fn an_unknown_key_is_named_with_the_known_ones() {
    let err = AllocConf::parse("bfc.memory_limit=1GiB,bfc.memory_limt=2GiB").unwrap_err();
    assert_eq!(err, ConfigError::UnknownKey { key: "bfc.memory_limt".into() });
    let msg = err.to_string();
    assert!(
        msg.starts_with("TENSORMEM_ALLOC_CONF: unknown key 'bfc.memory_limt' (known keys: bfc.memory_limit,"),
        "{msg}"
    );
}

#[test]
fn a_bad_value_names_the_key_and_what_was_expected() {
    let err = AllocConf::parse("pool.size_limit=4G").unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "TENSORMEM_ALLOC_CONF: bad value '4G' for pool.size_limit: expected a size such as 256MiB ({})",
            tensormem::SIZE_SPELLINGS
        )
    );
    assert!(err.to_string().contains("GiB") && err.to_string().contains("GB"), "the spellings are listed: {err}");
    let err = AllocConf::parse("bfc.allow_growth=maybe").unwrap_err();
    assert!(matches!(err, ConfigError::BadValue { key: "bfc.allow_growth", .. }), "{err}");
    let err = AllocConf::parse("pool.rounding=multiple:0").unwrap_err();
    assert!(matches!(err, ConfigError::BadValue { key: "pool.rounding", .. }), "{err}");
}

#[test]
fn malformed_and_duplicate_items_are_refused() {
    assert_eq!(
        AllocConf::parse("bfc.memory_limit").unwrap_err().to_string(),
        "TENSORMEM_ALLOC_CONF: 'bfc.memory_limit' is not of the form key=value"
    );
    assert_eq!(
        AllocConf::parse("pool.size_limit=1MiB,pool.size_limit=2MiB").unwrap_err(),
        ConfigError::Duplicate { key: "pool.size_limit" }
    );
}

#[test]
fn building_names_the_missing_or_refused_key() {
    // Without a limit, the bfc takes the machine's physical memory (the one rule everywhere).
    let bfc = AllocConf::parse("bfc.allow_growth=true").unwrap().build_bfc().unwrap();
    assert_eq!(bfc.stats().unwrap().bytes_limit, Some(tensormem::allocators::physical_memory()));
    let err = AllocConf::parse("bfc.memory_limit=0").unwrap().build_bfc().unwrap_err();
    assert_eq!(
        err.to_string(),
        "TENSORMEM_ALLOC_CONF: bfc.memory_limit=0: the bfc allocator needs a positive limit (at least 256 B, one chunk)"
    );
    assert!(!err.to_string().contains("bytes_limit"), "the message names the key given, not another option");
    let err = AllocConf::parse("bfc.memory_limit=100B").unwrap().build_bfc().unwrap_err();
    assert_eq!(
        err,
        ConfigError::Invalid {
            key: "bfc.memory_limit",
            value: "100".into(),
            rule: "the limit must hold at least one chunk or granule: 256 B or more".into()
        }
    );
    let err = AllocConf::parse("bfc.memory_limit=1GiB,bfc.expandable=true,bfc.growth_granule=0").unwrap_err();
    assert!(err.to_string().contains("for bfc.growth_granule: expected a positive size"), "{err}");
    let bfc = AllocConf::parse("bfc.memory_limit=8MiB").unwrap().build_bfc().unwrap();
    assert_eq!(bfc.stats().unwrap().bytes_limit, Some(8 << 20));
    let pool = AllocConf::parse("pool.size_limit=1MiB")
        .unwrap()
        .build_pool(std::sync::Arc::new(SystemAllocator::new()))
        .unwrap();
    assert_eq!(pool.pool_stats().size_limit, 1 << 20);
}

#[test]
fn cuda_keys_parse_with_or_without_the_feature() {
    use tensormem::AllocConf;
    let c = AllocConf::parse("cuda.memory_limit=16GiB,cuda_async.release_threshold=1GiB").unwrap();
    assert_eq!(c.cuda_memory_limit, Some(16 << 30));
    assert_eq!(c.cuda_async_release_threshold, Some(1 << 30));
    assert_eq!(c.cuda_limit(80 << 30), 16 << 30);
    let f = AllocConf::parse("cuda.memory_fraction=0.25").unwrap();
    assert_eq!(f.cuda_limit(80 << 30), 20 << 30);
    assert_eq!(AllocConf::parse("cuda.memory_fraction=1").unwrap().cuda_limit(1 << 30), 1 << 30);
    for bad in ["0", "-0.5", "1.0001", "nan", "inf", "half"] {
        let err = AllocConf::parse(&format!("cuda.memory_fraction={bad}")).unwrap_err();
        assert!(err.to_string().contains("cuda.memory_fraction: expected a number in (0, 1]"), "{bad}: {err}");
    }
    let both = AllocConf::parse("cuda.memory_limit=1GiB,cuda.memory_fraction=0.5").unwrap_err();
    assert!(both.to_string().contains("either cuda.memory_limit or cuda.memory_fraction, not both"), "{both}");
    assert!(AllocConf::parse("cuda.memory_limit=100B").is_err());
}

#[test]
fn huge_pages_are_on_for_the_pool_and_off_for_the_bfc_unless_configured() {
    let granule =
        |a: &dyn Allocator| a.backend_as::<BfcAllocator>().and_then(|b| b.memory_dump().expandable).map(|e| e.granule);
    let c = AllocConf::parse("pool.huge_pages=off, bfc.huge_pages=yes").unwrap();
    assert_eq!((c.pool_huge_pages, c.bfc_huge_pages), (Some(false), Some(true)));
    assert!(c.configures_bfc(), "a bfc.* key chooses bfc");
    let err = AllocConf::parse("pool.huge_pages=2MiB").unwrap_err();
    assert_eq!(
        err.to_string(),
        "TENSORMEM_ALLOC_CONF: bad value '2MiB' for pool.huge_pages: expected true or false (default true): large \
         blocks in 2 MiB transparent huge pages"
    );
    assert!(matches!(
        AllocConf::parse("bfc.huge_pages=").unwrap_err(),
        ConfigError::BadValue { key: "bfc.huge_pages", .. }
    ));
    if !cfg!(unix) {
        return;
    }
    let system = || -> std::sync::Arc<dyn Allocator> { std::sync::Arc::new(SystemAllocator::new()) };
    for (text, expected) in [("", 2 << 20), ("pool.huge_pages=true", 2 << 20), ("pool.huge_pages=false", 4096)] {
        let pool = AllocConf::parse(text).unwrap().build_pool(system()).unwrap();
        let (_, large) = pool.large_allocator().unwrap();
        assert_eq!(granule(&**large), Some(expected), "{text:?}");
    }
    for (text, expected) in [("bfc.memory_limit=64MiB", 4096), ("bfc.memory_limit=64MiB,bfc.huge_pages=true", 2 << 20)]
    {
        let bfc = AllocConf::parse(text).unwrap().build_bfc().unwrap();
        assert_eq!(granule(&bfc), Some(expected), "{text:?}");
    }
    let err = AllocConf::parse("bfc.memory_limit=1MiB,bfc.expandable=true,bfc.huge_pages=true")
        .unwrap()
        .build_bfc()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "TENSORMEM_ALLOC_CONF: bfc.memory_limit=1048576: the limit must hold at least one chunk or granule: 2097152 B \
         or more"
    );
}

#[test]
fn keys_and_words_are_case_insensitive_and_booleans_have_one_rule() {
    let c =
        AllocConf::parse("BFC.MEMORY_LIMIT=4GIB, Bfc.Allow_Growth=TRUE, POOL.ROUNDING=Power_Of_Two, bfc.split=PyTorch")
            .unwrap();
    assert_eq!(c.bfc_memory_limit, Some(4 << 30));
    assert_eq!(c.bfc_allow_growth, Some(true));
    assert_eq!(c.pool_rounding, Some(SizeRounding::PowerOfTwo));
    assert!(c.bfc_split.is_some());
    for (word, value) in [("true", true), ("FALSE", false), ("yes", true), ("No", false), ("on", true), ("0", false)] {
        assert_eq!(AllocConf::parse(&format!("bfc.expandable={word}")).unwrap().bfc_expandable, Some(value), "{word}");
    }
    for bad in ["t", "2", "enabled", ""] {
        assert!(AllocConf::parse(&format!("bfc.expandable={bad}")).is_err(), "{bad}");
    }
    // Twice in different case is still twice.
    assert!(matches!(
        AllocConf::parse("bfc.memory_limit=1GiB,BFC.MEMORY_LIMIT=2GiB"),
        Err(ConfigError::Duplicate { key: "bfc.memory_limit" })
    ));
}

#[test]
fn every_size_key_has_a_range_that_names_the_key() {
    let sizes = [
        "bfc.memory_limit",
        "bfc.growth_granule",
        "bfc.release_threshold",
        "bfc.first_fit_above",
        "bfc.max_internal_fragmentation",
        "pool.size_limit",
        "pool.large_threshold",
        "cuda.memory_limit",
        "cuda_async.release_threshold",
    ];
    for key in sizes {
        for value in ["18446744073709551615", "257TiB", "300000000000000000B"] {
            let err = AllocConf::parse(&format!("{key}={value}")).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains(key), "{key}={value}: {msg}");
            assert!(msg.contains("at most 256.0 TiB") || msg.contains("bad value"), "{key}={value}: {msg}");
        }
        // The largest value accepted is accepted.
        let at_max = AllocConf::parse(&format!("{key}=256TiB"));
        assert!(at_max.is_ok(), "{key}=256TiB: {at_max:?}");
    }
    for (key, value) in [("pool.rounding", "multiple:300TiB"), ("bfc.split", "remainder:300TiB")] {
        let msg = AllocConf::parse(&format!("{key}={value}")).unwrap_err().to_string();
        assert!(msg.contains(key) && msg.contains("at most 256.0 TiB"), "{msg}");
    }
    let msg = AllocConf::parse("bfc.peak_headroom=1e300").unwrap_err().to_string();
    assert!(msg.contains("bfc.peak_headroom"), "{msg}");
}

#[test]
fn extreme_values_in_range_build_allocators_that_allocate_or_refuse_without_panicking() {
    use tensormem::AllocatorExt;
    for conf in [
        "bfc.memory_limit=64MiB,bfc.growth_granule=256TiB",
        "bfc.memory_limit=64MiB,bfc.growth_granule=1TiB",
        "bfc.memory_limit=64MiB,bfc.growth_granule=1B",
        "bfc.memory_limit=64MiB,bfc.max_internal_fragmentation=256TiB,bfc.release_threshold=256TiB",
        "bfc.memory_limit=64MiB,bfc.first_fit_above=256TiB,bfc.peak_headroom=1",
        "bfc.memory_limit=64MiB,bfc.split=remainder:256TiB",
        "bfc.memory_limit=64MiB,bfc.expandable=false,bfc.growth_granule=256TiB",
    ] {
        let c = AllocConf::parse(conf).unwrap();
        match c.build_bfc() {
            Err(e) => assert!(e.to_string().contains("bfc."), "{conf}: {e}"),
            Ok(bfc) => {
                let p = bfc.allocate::<u8>(1 << 20).unwrap_or_else(|e| panic!("{conf}: {e}"));
                // SAFETY: `p` came from `allocate::<u8>(1 << 20)` on `bfc`.
                unsafe { bfc.deallocate(p, 1 << 20) };
            }
        }
    }
    let err = AllocConf::parse("bfc.memory_limit=64MiB,bfc.growth_granule=2TiB").unwrap().build_bfc().unwrap_err();
    assert!(err.to_string().contains("bfc.growth_granule"), "{err}");
    for conf in ["pool.rounding=multiple:256TiB", "pool.size_limit=256TiB,pool.large_threshold=256TiB"] {
        let pool = AllocConf::parse(conf).unwrap().build_pool(std::sync::Arc::new(SystemAllocator::new()));
        if let Ok(pool) = pool {
            match pool.allocate::<u8>(4096) {
                Ok(p) => {
                    // SAFETY: `p` came from `allocate::<u8>(4096)` on `pool`.
                    unsafe { pool.deallocate(p, 4096) };
                }
                Err(e) => assert!(!e.to_string().is_empty(), "{conf}"),
            }
        }
    }
}

//! [`AllocConf`]: the `TENSORMEM_ALLOC_CONF` startup configuration of the `bfc` and `pool`
//! allocators, in the spirit of `PYTORCH_CUDA_ALLOC_CONF`.
//!
//! One rule for spelling, as for allocator names: keys and words (`true`, `none`, `pytorch`,
//! `power_of_two`, size units...) are case-insensitive, so `BFC.MEMORY_LIMIT=4GIB` is
//! `bfc.memory_limit=4GiB`. A boolean is `true` or `false`; `yes`/`no`, `on`/`off` and `1`/`0`
//! are accepted as the same two values. Every size is at most [`MAX_SIZE`] and every fraction
//! has a range, so a value no machine can use is refused with the key named instead of
//! overflowing later.

use std::sync::Arc;

use crate::allocators::{
    Allocator, BfcAllocator, BuildError, ByteSize, HugePageSubAllocator, PoolAllocator, SizeRounding, SplitPolicy,
};

/// The environment variable holding the configuration.
pub const ALLOC_CONF_ENV: &str = "TENSORMEM_ALLOC_CONF";

/// How sizes are spelled, for error messages.
pub const SIZE_SPELLINGS: &str = "a number of bytes with an optional unit: B; KiB, MiB, GiB, TiB (powers of 1024); \
     KB, MB, GB, TB (powers of 1000); decimals allowed (1.5GiB); units are case-insensitive";

/// The largest size any key accepts: 256 TiB, more than any machine's address space or
/// device memory (x86-64 and AArch64 give a process at most 128 TiB with 4-level page tables).
pub const MAX_SIZE: u64 = 1 << 48;

/// Every key `TENSORMEM_ALLOC_CONF` accepts, with what its value must be.
pub const KEYS: [(&str, &str); 19] = [
    ("bfc.memory_limit", "a size such as 4GiB, at least 256 B (default: the machine's physical memory)"),
    ("bfc.allow_growth", "true or false"),
    ("bfc.expandable", "true or false"),
    ("bfc.growth_granule", "a positive size such as 2MiB"),
    ("bfc.split", "tensorflow, pytorch, or remainder:<size>"),
    ("bfc.release_threshold", "a size such as 1GiB, or none"),
    ("bfc.first_fit_above", "a size such as 64KiB, or none"),
    ("bfc.peak_headroom", "a fraction from 0 to 1 such as 0.04, or none"),
    ("bfc.garbage_collection", "true or false"),
    ("bfc.max_internal_fragmentation", "a size such as 128MiB"),
    ("bfc.huge_pages", "true or false (default false): memory in 2 MiB transparent huge pages"),
    ("pool.size_limit", "a size such as 256MiB"),
    ("pool.rounding", "power_of_two, exact, or multiple:<size>"),
    ("pool.auto_resize", "true or false"),
    ("pool.large_threshold", "a positive size such as 1MiB, or none"),
    ("pool.huge_pages", "true or false (default true): large blocks in 2 MiB transparent huge pages"),
    ("cuda.memory_limit", "a size such as 16GiB, at least 256 B: the limit of each cuda:N allocator"),
    (
        "cuda.memory_fraction",
        "a number in (0, 1]: the share of each device's total memory its cuda:N allocator may use",
    ),
    ("cuda_async.release_threshold", "a size such as 1GiB: the freed bytes each cuda_async:N pool keeps"),
];

/// The share of a device's memory a `cuda:N` allocator may use when neither `cuda.memory_limit`
/// nor `cuda.memory_fraction` is set (TensorFlow's default leaves room for the driver too).
pub const DEFAULT_CUDA_MEMORY_FRACTION: f64 = 0.9;

/// What is wrong with a configuration; every variant names the key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A key that is not one of [`KEYS`].
    #[error("{ALLOC_CONF_ENV}: unknown key '{key}' (known keys: {})", KEYS.map(|k| k.0).join(", "))]
    UnknownKey {
        /// The key as written.
        key: String,
    },
    /// A value that does not parse.
    #[error("{ALLOC_CONF_ENV}: bad value '{value}' for {key}: expected {expected}{}", size_help(.expected, .value))]
    BadValue {
        /// The key.
        key: &'static str,
        /// The value as written.
        value: String,
        /// What the value must look like.
        expected: &'static str,
    },
    /// An item without `=`.
    #[error("{ALLOC_CONF_ENV}: '{item}' is not of the form key=value")]
    Malformed {
        /// The item as written.
        item: String,
    },
    /// The same key twice.
    #[error("{ALLOC_CONF_ENV}: {key} is given twice")]
    Duplicate {
        /// The key.
        key: &'static str,
    },
    /// A key needed for what was asked is missing.
    #[error("{ALLOC_CONF_ENV}: {key} is required {why}")]
    Missing {
        /// The missing key.
        key: &'static str,
        /// What needs it.
        why: &'static str,
    },
    /// A value parses but breaks the allocator's rule for it.
    #[error("{ALLOC_CONF_ENV}: {key}={value}: {rule}")]
    Invalid {
        /// The key.
        key: &'static str,
        /// The value as given (or as parsed).
        value: String,
        /// The rule it breaks, and what to do.
        rule: String,
    },
    /// The values parse but the allocator refuses them for a reason no single key explains.
    #[error("{ALLOC_CONF_ENV}: {0}")]
    Build(BuildError),
}

/// For a size value, the spellings that exist.
fn size_help(expected: &str, value: &str) -> String {
    if expected.contains("size") && !value.is_empty() { format!(" ({SIZE_SPELLINGS})") } else { String::new() }
}

/// The parsed configuration. Unset options keep the allocators' defaults.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AllocConf {
    /// `bfc.memory_limit`.
    pub bfc_memory_limit: Option<u64>,
    /// `bfc.allow_growth`.
    pub bfc_allow_growth: Option<bool>,
    /// `bfc.expandable`.
    pub bfc_expandable: Option<bool>,
    /// `bfc.growth_granule`.
    pub bfc_growth_granule: Option<u64>,
    /// `bfc.split`.
    pub bfc_split: Option<SplitPolicy>,
    /// `bfc.release_threshold` (`Some(None)`: `none`, keep everything).
    pub bfc_release_threshold: Option<Option<u64>>,
    /// `bfc.first_fit_above` (`Some(None)`: `none`, best fit for every size).
    pub bfc_first_fit_above: Option<Option<u64>>,
    /// `bfc.peak_headroom` (`Some(None)`: `none`, reserved follows the placement).
    pub bfc_peak_headroom: Option<Option<f64>>,
    /// `bfc.garbage_collection`.
    pub bfc_garbage_collection: Option<bool>,
    /// `bfc.max_internal_fragmentation`.
    pub bfc_max_internal_fragmentation: Option<u64>,
    /// `bfc.huge_pages`: memory from [`HugePageSubAllocator`] instead of the OS's 4 KiB pages.
    pub bfc_huge_pages: Option<bool>,
    /// `pool.size_limit`.
    pub pool_size_limit: Option<u64>,
    /// `pool.rounding`.
    pub pool_rounding: Option<SizeRounding>,
    /// `pool.auto_resize`.
    pub pool_auto_resize: Option<bool>,
    /// `pool.large_threshold` (`Some(None)`: `none`, no large allocator).
    pub pool_large_threshold: Option<Option<u64>>,
    /// `pool.huge_pages` ([`PoolBuilder::huge_pages`](crate::allocators::PoolBuilder::huge_pages)).
    pub pool_huge_pages: Option<bool>,
    /// `cuda.memory_limit`.
    pub cuda_memory_limit: Option<u64>,
    /// `cuda.memory_fraction`, in (0, 1].
    pub cuda_memory_fraction: Option<f64>,
    /// `cuda_async.release_threshold`.
    pub cuda_async_release_threshold: Option<u64>,
}

impl AllocConf {
    /// Parses `key=value` items separated by commas (spaces around items are ignored).
    ///
    /// ```
    /// use tensormem::AllocConf;
    /// let c = AllocConf::parse("bfc.memory_limit=4GiB, bfc.allow_growth=true,pool.size_limit=256MiB")?;
    /// assert_eq!(c.bfc_memory_limit, Some(4 << 30));
    /// assert_eq!(c.pool_size_limit, Some(256 << 20));
    /// let err = AllocConf::parse("bfc.memory_limt=1GiB").unwrap_err();
    /// assert!(err.to_string().contains("unknown key 'bfc.memory_limt'"));
    /// # Ok::<(), tensormem::ConfigError>(())
    /// ```
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first bad key or item.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let mut conf = Self::default();
        let mut seen: Vec<&'static str> = Vec::new();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (key, value) = item.split_once('=').ok_or_else(|| ConfigError::Malformed { item: item.to_owned() })?;
            let (key, value) = (key.trim(), value.trim());
            let (key, expected) = *KEYS
                .iter()
                .find(|k| k.0.eq_ignore_ascii_case(key))
                .ok_or_else(|| ConfigError::UnknownKey { key: key.to_owned() })?;
            if seen.contains(&key) {
                return Err(ConfigError::Duplicate { key });
            }
            seen.push(key);
            let bad = || ConfigError::BadValue { key, value: value.to_owned(), expected };
            if expected.contains("size")
                && let Some(size) = spelled_size(value)
                && size > MAX_SIZE
            {
                return Err(ConfigError::Invalid {
                    key,
                    value: value.to_owned(),
                    rule: format!("at most {} ({MAX_SIZE} bytes) is accepted for a size", ByteSize(MAX_SIZE)),
                });
            }
            match key {
                "bfc.memory_limit" => conf.bfc_memory_limit = Some(parse_size(value).ok_or_else(bad)?),
                "bfc.allow_growth" => conf.bfc_allow_growth = Some(parse_bool(value).ok_or_else(bad)?),
                "bfc.expandable" => conf.bfc_expandable = Some(parse_bool(value).ok_or_else(bad)?),
                "bfc.growth_granule" => {
                    conf.bfc_growth_granule = Some(parse_size(value).filter(|&g| g > 0).ok_or_else(bad)?);
                }
                "bfc.split" => conf.bfc_split = Some(parse_split(value).ok_or_else(bad)?),
                "bfc.release_threshold" => {
                    conf.bfc_release_threshold = Some(parse_size_or_none(value).ok_or_else(bad)?)
                }
                "bfc.first_fit_above" => conf.bfc_first_fit_above = Some(parse_size_or_none(value).ok_or_else(bad)?),
                "bfc.peak_headroom" => conf.bfc_peak_headroom = Some(parse_fraction_or_none(value).ok_or_else(bad)?),
                "pool.large_threshold" => {
                    conf.pool_large_threshold =
                        Some(parse_size_or_none(value).filter(|t| *t != Some(0)).ok_or_else(bad)?);
                }
                "bfc.garbage_collection" => conf.bfc_garbage_collection = Some(parse_bool(value).ok_or_else(bad)?),
                "bfc.max_internal_fragmentation" => {
                    conf.bfc_max_internal_fragmentation = Some(parse_size(value).ok_or_else(bad)?);
                }
                "bfc.huge_pages" => conf.bfc_huge_pages = Some(parse_bool(value).ok_or_else(bad)?),
                "pool.huge_pages" => conf.pool_huge_pages = Some(parse_bool(value).ok_or_else(bad)?),
                "pool.size_limit" => conf.pool_size_limit = Some(parse_size(value).ok_or_else(bad)?),
                "pool.rounding" => conf.pool_rounding = Some(parse_rounding(value).ok_or_else(bad)?),
                "cuda.memory_limit" => {
                    conf.cuda_memory_limit = Some(parse_size(value).filter(|&l| l >= 256).ok_or_else(bad)?);
                }
                "cuda.memory_fraction" => {
                    let f = value.parse::<f64>().ok().filter(|f| *f > 0.0 && *f <= 1.0);
                    conf.cuda_memory_fraction = Some(f.ok_or_else(bad)?);
                }
                "cuda_async.release_threshold" => {
                    conf.cuda_async_release_threshold = Some(parse_size(value).ok_or_else(bad)?);
                }
                _ => conf.pool_auto_resize = Some(parse_bool(value).ok_or_else(bad)?),
            }
        }
        if conf.cuda_memory_limit.is_some() && conf.cuda_memory_fraction.is_some() {
            return Err(ConfigError::BadValue {
                key: "cuda.memory_fraction",
                value: conf.cuda_memory_fraction.map(|f| f.to_string()).unwrap_or_default(),
                expected: "either cuda.memory_limit or cuda.memory_fraction, not both",
            });
        }
        Ok(conf)
    }

    /// The limit of a `cuda:N` allocator on a device of `total` bytes: `cuda.memory_limit`, else
    /// `cuda.memory_fraction` (default [`DEFAULT_CUDA_MEMORY_FRACTION`]) of `total`, rounded down
    /// to 256 bytes.
    ///
    /// ```
    /// use tensormem::AllocConf;
    /// let c = AllocConf::parse("cuda.memory_fraction=0.5")?;
    /// assert_eq!(c.cuda_limit(80 << 30), 40 << 30);
    /// assert_eq!(AllocConf::default().cuda_limit(1000), 768);
    /// assert!(AllocConf::parse("cuda.memory_fraction=1.5").is_err());
    /// # Ok::<(), tensormem::ConfigError>(())
    /// ```
    pub fn cuda_limit(&self, total: u64) -> u64 {
        let bytes = match (self.cuda_memory_limit, self.cuda_memory_fraction) {
            (Some(l), _) => l,
            (None, f) => (total as f64 * f.unwrap_or(DEFAULT_CUDA_MEMORY_FRACTION)) as u64,
        };
        bytes & !255
    }

    /// Parses `TENSORMEM_ALLOC_CONF` (unset or empty: the defaults).
    ///
    /// # Errors
    /// As [`parse`](Self::parse); a value that is not UTF-8 is malformed.
    pub fn from_env() -> Result<Self, ConfigError> {
        match std::env::var(ALLOC_CONF_ENV) {
            Ok(v) => Self::parse(&v),
            Err(std::env::VarError::NotPresent) => Ok(Self::default()),
            Err(std::env::VarError::NotUnicode(v)) => {
                Err(ConfigError::Malformed { item: v.to_string_lossy().into_owned() })
            }
        }
    }

    /// Whether any `bfc.*` key is set.
    pub fn configures_bfc(&self) -> bool {
        self.bfc_memory_limit.is_some()
            || self.bfc_allow_growth.is_some()
            || self.bfc_expandable.is_some()
            || self.bfc_growth_granule.is_some()
            || self.bfc_split.is_some()
            || self.bfc_release_threshold.is_some()
            || self.bfc_first_fit_above.is_some()
            || self.bfc_peak_headroom.is_some()
            || self.bfc_garbage_collection.is_some()
            || self.bfc_max_internal_fragmentation.is_some()
            || self.bfc_huge_pages.is_some()
    }

    /// The limit of the `bfc` allocator: `bfc.memory_limit`, else the machine's physical memory
    /// ([`physical_memory`](crate::allocators::physical_memory)). One rule wherever a BFC is
    /// made from a configuration: the registry, `tensormem demo` and `tensormem replay`.
    ///
    /// ```
    /// use tensormem::AllocConf;
    /// assert_eq!(AllocConf::parse("bfc.memory_limit=4GiB")?.bfc_limit(), 4 << 30);
    /// assert_eq!(AllocConf::default().bfc_limit(), tensormem::allocators::physical_memory());
    /// # Ok::<(), tensormem::ConfigError>(())
    /// ```
    pub fn bfc_limit(&self) -> u64 {
        self.bfc_memory_limit.unwrap_or_else(crate::allocators::physical_memory)
    }

    /// Builds the `bfc` allocator, limited to [`bfc_limit`](Self::bfc_limit) (a `tracing`
    /// message says when that is the default).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] or [`ConfigError::Build`] when the allocator refuses the values
    /// (e.g. a limit of 0).
    pub fn build_bfc(&self) -> Result<BfcAllocator, ConfigError> {
        let limit = self.bfc_limit();
        if self.bfc_memory_limit.is_none() {
            tracing::info!(
                limit,
                "bfc: no bfc.memory_limit in {ALLOC_CONF_ENV}; limited to the machine's physical memory, {}",
                ByteSize(limit)
            );
        }
        let mut b = BfcAllocator::builder().memory_limit(limit);
        if self.bfc_huge_pages == Some(true) {
            b = b.sub_allocator(Arc::new(HugePageSubAllocator));
        }
        if let Some(v) = self.bfc_allow_growth {
            b = b.allow_growth(v);
        }
        if let Some(v) = self.bfc_expandable {
            b = b.expandable(v);
        }
        if let Some(v) = self.bfc_growth_granule {
            b = b.growth_granule(v);
        }
        if let Some(v) = self.bfc_split {
            b = b.split(v);
        }
        if let Some(v) = self.bfc_release_threshold {
            b = b.release_threshold(v);
        }
        if let Some(v) = self.bfc_first_fit_above {
            b = b.first_fit_above(v.unwrap_or(u64::MAX));
        }
        if let Some(v) = self.bfc_peak_headroom {
            b = b.peak_headroom(v);
        }
        if let Some(v) = self.bfc_garbage_collection {
            b = b.garbage_collection(v);
        }
        if let Some(v) = self.bfc_max_internal_fragmentation {
            b = b.max_internal_fragmentation_bytes(v);
        }
        b.build().map_err(|e| self.bfc_error(e))
    }

    /// Names the key behind a refusal of the `bfc` allocator, with its rule.
    fn bfc_error(&self, e: BuildError) -> ConfigError {
        let limit = || self.bfc_limit().to_string();
        match e {
            BuildError::ZeroLimit { .. } => ConfigError::Invalid {
                key: "bfc.memory_limit",
                value: limit(),
                rule: "the bfc allocator needs a positive limit (at least 256 B, one chunk)".to_owned(),
            },
            BuildError::LimitTooSmall { minimum, .. } => ConfigError::Invalid {
                key: "bfc.memory_limit",
                value: limit(),
                rule: format!("the limit must hold at least one chunk or granule: {minimum} B or more"),
            },
            BuildError::Reserve { reason, bytes, .. } => ConfigError::Invalid {
                key: "bfc.memory_limit",
                value: limit(),
                rule: format!(
                    "its {bytes} bytes of address space cannot be reserved ({reason}); lower it, or set \
                     bfc.expandable=false"
                ),
            },
            BuildError::InvalidOption { option: "expandable", reason, .. } => {
                ConfigError::Invalid { key: "bfc.expandable", value: "true".to_owned(), rule: reason }
            }
            BuildError::InvalidOption { option: "growth_granule", reason, .. } => ConfigError::Invalid {
                key: "bfc.growth_granule",
                value: self.bfc_growth_granule.map_or_else(String::new, |g| g.to_string()),
                rule: reason,
            },
            other => ConfigError::Build(other),
        }
    }

    /// Builds the `pool` allocator over `inner`.
    ///
    /// # Errors
    /// [`ConfigError::Build`] when the pool refuses the values.
    pub fn build_pool(&self, inner: Arc<dyn Allocator>) -> Result<PoolAllocator, ConfigError> {
        let mut b = PoolAllocator::builder(inner);
        if let Some(v) = self.pool_size_limit {
            b = b.size_limit(v);
        }
        if let Some(v) = self.pool_rounding {
            b = b.rounding(v);
        }
        if let Some(v) = self.pool_auto_resize {
            b = b.auto_resize(v);
        }
        if let Some(v) = self.pool_large_threshold {
            b = b.large_threshold(v);
        }
        if let Some(v) = self.pool_huge_pages {
            b = b.huge_pages(v);
        }
        b.build().map_err(|e| match e {
            BuildError::InvalidOption { option: "rounding", reason, .. } => {
                ConfigError::Invalid { key: "pool.rounding", value: format!("{:?}", self.pool_rounding), rule: reason }
            }
            other => ConfigError::Build(other),
        })
    }
}

/// Parses a size: a number of bytes, optionally with decimals, and a unit: `B`; `KiB`, `MiB`,
/// `GiB`, `TiB` (powers of 1024); `KB`, `MB`, `GB`, `TB` (powers of 1000). Units are
/// case-insensitive; a space before the unit is allowed; fractions of a byte are dropped. A bare
/// `K`, `M`, `G` or `T` is refused rather than guessed (see [`SIZE_SPELLINGS`]).
///
/// ```
/// use tensormem::parse_size;
/// assert_eq!(parse_size("4GiB"), Some(4 << 30));
/// assert_eq!(parse_size("1.5GiB"), Some(3 << 29));
/// assert_eq!(parse_size("2GB"), Some(2_000_000_000));
/// assert_eq!(parse_size("512"), Some(512));
/// assert_eq!(parse_size("4G"), None);
/// ```
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let unit: u128 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return None,
    };
    let (whole, fraction) = match number.split_once('.') {
        Some((w, f)) => (w, f),
        None => (number, ""),
    };
    if whole.is_empty() && fraction.is_empty() || fraction.len() > 18 || fraction.contains('.') {
        return None;
    }
    let whole: u128 = if whole.is_empty() { 0 } else { whole.parse().ok()? };
    let fraction_value: u128 = if fraction.is_empty() { 0 } else { fraction.parse().ok()? };
    let scale = 10u128.pow(fraction.len() as u32);
    let bytes = whole.checked_mul(unit)?.checked_add(fraction_value.checked_mul(unit)? / scale)?;
    u64::try_from(bytes).ok()
}

/// A size, or `none`.
fn parse_size_or_none(s: &str) -> Option<Option<u64>> {
    if s.trim().eq_ignore_ascii_case("none") { Some(None) } else { parse_size(s).map(Some) }
}

/// A finite fraction of at least 0, or `none`.
fn parse_fraction_or_none(s: &str) -> Option<Option<f64>> {
    if s.trim().eq_ignore_ascii_case("none") {
        return Some(None);
    }
    s.trim().parse::<f64>().ok().filter(|f| (0.0..=1.0).contains(f)).map(Some)
}

/// The size a size key's value spells (`4GiB`, `multiple:4GiB`, `remainder:1MiB`), for the
/// range check that every size key shares.
fn spelled_size(value: &str) -> Option<u64> {
    parse_size(value.rsplit(':').next().unwrap_or(value))
}

/// `tensorflow`, `pytorch`, or `remainder:<size>`.
fn parse_split(s: &str) -> Option<SplitPolicy> {
    match s.trim().to_ascii_lowercase().strip_prefix("remainder:") {
        Some(size) => {
            let n = usize::try_from(parse_size(size)?).ok()?;
            Some(SplitPolicy::Remainder(n.max(256).checked_next_multiple_of(256)?))
        }
        None => s.to_ascii_lowercase().parse().ok(),
    }
}

fn parse_bool(s: &str) -> Option<bool> {
    match s.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Some(true),
        "false" | "0" | "no" | "off" => Some(false),
        _ => None,
    }
}

fn parse_rounding(s: &str) -> Option<SizeRounding> {
    let s = s.to_ascii_lowercase();
    let s = s.as_str();
    match s {
        "power_of_two" => Some(SizeRounding::PowerOfTwo),
        "exact" => Some(SizeRounding::Exact),
        _ => {
            let m = parse_size(s.strip_prefix("multiple:")?)?;
            (m > 0).then(|| SizeRounding::Multiple(usize::try_from(m).unwrap_or(usize::MAX)))
        }
    }
}

//! [`AllocatorRegistry`]: allocators by name and priority, with a startup override.

use std::env;
use std::fmt;
use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;

use crate::allocators::{Allocator, SystemAllocator};
use crate::config::{AllocConf, ConfigError};
use crate::registration::AllocatorFactory;

/// The environment variable that picks the global registry's allocator by name.
pub const ALLOCATOR_ENV: &str = "TENSORMEM_ALLOCATOR";

/// The priority of the device allocators (`cuda:N`, `cuda_async:N`, `cuda_host`, feature
/// `cuda`): below every host allocator, so that [`AllocatorRegistry::get`] keeps returning host
/// memory. Device memory is chosen by name (`get_by_name("cuda:0")`, or
/// `TENSORMEM_ALLOCATOR=cuda:0` to make it the default, for code that only hands memory to the
/// device), by [`AllocatorRegistry::get_for_space`] or by attributes
/// ([`AllocatorRegistry::get_for`]).
pub const DEVICE_PRIORITY: i32 = -1000;

/// The priority of an allocator configured by `TENSORMEM_ALLOC_CONF` in the global registry
/// (`bfc` when a `bfc.*` key is set): above every built-in, so configuring it chooses it.
pub const CONFIGURED_PRIORITY: i32 = 200;

/// The priority of `pool`, the global registry's default: above `cpu` and `jemalloc`, below a
/// configured allocator.
pub const DEFAULT_PRIORITY: i32 = 100;

/// Allocators the global registry can make when configured, and how.
const CONFIGURABLE: [(&str, &str); 1] = [("bfc", "TENSORMEM_ALLOC_CONF=bfc.memory_limit=<size>")];

/// A registered allocator with its name and priority, as listed by
/// [`AllocatorRegistry::entries`].
#[derive(Clone, Debug)]
pub struct RegistryEntry {
    /// The name it was registered under.
    pub name: String,
    /// Its priority; [`AllocatorRegistry::get`] returns the highest.
    pub priority: i32,
    /// The allocator.
    pub allocator: Arc<dyn Allocator>,
}

/// What went wrong registering or choosing an allocator.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// The same (name, priority) was registered twice.
    #[error(
        "allocator '{name}' with priority {priority} is already registered (registration #{first_index}, \
         allocator '{first_allocator}'); refusing registration #{second_index} (allocator '{second_allocator}')"
    )]
    Duplicate {
        /// The name both registrations used.
        name: String,
        /// The priority both registrations used.
        priority: i32,
        /// 1-based position of the registration that stands.
        first_index: usize,
        /// `name()` of the allocator that stands.
        first_allocator: String,
        /// 1-based position the refused registration would have had.
        second_index: usize,
        /// `name()` of the refused allocator.
        second_allocator: String,
    },
    /// An allocator was selected by a name that nothing is registered under.
    #[error(
        "{}no allocator named '{requested}' is registered (registered: {}{}; names are compared \
         case-insensitively)", origin.prefix(), list_or_none(.registered), how_to_configure(.configurable)
    )]
    UnknownAllocator {
        /// The name asked for.
        requested: String,
        /// Where the choice came from.
        origin: SelectionOrigin,
        /// The registered names, highest priority first.
        registered: Vec<String>,
        /// For the global registry, the allocators it would make if configured, with how.
        configurable: Vec<String>,
    },
    /// The registry has no allocator to give.
    #[error("no allocator is registered")]
    Empty,
    /// `TENSORMEM_ALLOC_CONF` is wrong, or the allocator it configures refused the values.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A registration used an empty name.
    #[error("an allocator must be registered under a non-empty name (priority {priority})")]
    EmptyName {
        /// The priority of the refused registration.
        priority: i32,
    },
    /// A `register_allocator!` factory made an allocator that reports another name than the
    /// one it is registered under: selecting it by the name that `get()` shows would fail.
    #[error(
        "register_allocator!(\"{registered}\", ..) made an allocator named '{reported}': an allocator must report \
         the name it is registered under (give it .name(\"{registered}\"), or register it as \"{reported}\")"
    )]
    NameMismatch {
        /// The name given to `register_allocator!`.
        registered: String,
        /// What the allocator's `name()` returns.
        reported: String,
    },
}

fn list_or_none(names: &[String]) -> String {
    if names.is_empty() { "none".to_owned() } else { names.join(", ") }
}

/// The allocators that could be configured, and how.
fn how_to_configure(how: &[String]) -> String {
    if how.is_empty() { String::new() } else { format!("; can be configured: {}", how.join(", ")) }
}

/// Where an allocator choice by name came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SelectionOrigin {
    /// The `TENSORMEM_ALLOCATOR` environment variable.
    Environment,
    /// [`AllocatorRegistry::select`].
    Code,
}

impl SelectionOrigin {
    /// What an error about the choice starts with: the variable for a choice made by the
    /// environment, nothing for one made by the program (its caller knows where it came from).
    fn prefix(self) -> &'static str {
        match self {
            Self::Environment => "TENSORMEM_ALLOCATOR: ",
            Self::Code => "",
        }
    }
}

impl fmt::Display for SelectionOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Environment => write!(f, "{ALLOCATOR_ENV}"),
            Self::Code => f.write_str("AllocatorRegistry::select"),
        }
    }
}

#[derive(Debug)]
struct Inner {
    /// In registration order.
    entries: Vec<RegistryEntry>,
    /// Registrations made so far (refused ones included), for error messages.
    attempts: usize,
    selected: Option<(String, SelectionOrigin)>,
    /// Errors from registrations made at startup by `register_allocator!`.
    startup_errors: Vec<RegistryError>,
    /// Whether `TENSORMEM_ALLOC_CONF` configures this registry (the global one).
    configured_from_env: bool,
}

/// Allocators by name and priority: TensorFlow's `AllocatorRegistry`.
///
/// [`get`](Self::get) returns the allocator with the highest priority; on a tie the one
/// registered first wins, and registering a second allocator at the top priority logs a
/// `tracing` warning (it would never be chosen by priority: give it a higher one). A name chosen
/// with [`select`](Self::select) (for the global registry: the `TENSORMEM_ALLOCATOR` environment
/// variable) overrides the priorities.
///
/// A name stands for one allocator. Names are compared case-insensitively, as `select` and
/// `TENSORMEM_ALLOCATOR` compare them. Registering a name again at the same priority is refused
/// ([`RegistryError::Duplicate`]); at another priority the new registration replaces the old one,
/// with a `tracing` warning (an override, as a startup flag overrides a default), so the metrics
/// have one `allocator` series per name. One allocator may stand under several names (aliases).
///
/// The [`global`](Self::global) registry starts with:
///
/// | name | allocator | priority |
/// |---|---|---|
/// | `cpu` | [`SystemAllocator`] | 0 |
/// | `jemalloc` | `JemallocAllocator` (feature `jemalloc`) | 50 |
/// | `pool` | `PoolAllocator` over `jemalloc` (or `cpu`), large requests to an expandable BFC: **the default**, so that tensors and every other default allocation reuse memory | [`DEFAULT_PRIORITY`] (100) |
/// | `bfc` | `BfcAllocator`, when `TENSORMEM_ALLOC_CONF` sets a `bfc.*` key: configuring it chooses it | [`CONFIGURED_PRIORITY`] (200) |
///
/// plus every allocator registered with [`register_allocator!`](crate::register_allocator).
/// `pool` and `bfc` are configured from `TENSORMEM_ALLOC_CONF` (see [`AllocConf`]).
///
/// ```
/// use std::sync::Arc;
/// use tensormem::{AllocatorRegistry, SystemAllocator};
///
/// let registry = AllocatorRegistry::new();
/// registry.register("small", 10, Arc::new(SystemAllocator::builder().name("small").bytes_limit(1 << 20).build()?))?;
/// registry.register("cpu", 0, Arc::new(SystemAllocator::new()))?;
/// assert_eq!(registry.get().name(), "small");
///
/// registry.select(Some("CPU"))?; // names compare case-insensitively
/// assert_eq!(registry.get().name(), "cpu");
/// assert!(registry.select(Some("gpu")).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct AllocatorRegistry {
    inner: RwLock<Inner>,
    /// The process-wide registry: the one `with_default_allocator` overrides.
    is_global: bool,
}

impl AllocatorRegistry {
    /// An empty, isolated registry.
    pub fn new() -> Self {
        Self {
            is_global: false,
            inner: RwLock::new(Inner {
                entries: Vec::new(),
                attempts: 0,
                selected: None,
                startup_errors: Vec::new(),
                configured_from_env: false,
            }),
        }
    }

    /// The process-wide registry, set up on first use (see the type's docs for what it holds).
    ///
    /// `TENSORMEM_ALLOCATOR` is read then; an empty value counts as unset. A name that is not
    /// registered is reported by [`try_get`](Self::try_get) (and makes [`get`](Self::get)
    /// panic), not ignored.
    pub fn global() -> &'static AllocatorRegistry {
        static GLOBAL: OnceLock<AllocatorRegistry> = OnceLock::new();
        GLOBAL.get_or_init(Self::with_defaults)
    }

    fn with_defaults() -> Self {
        // Installs the observer, so that refusals of the allocators picked here are reported
        // (see `tensormem::oom`).
        crate::observation::hub::hub();
        let registry = Self::new();
        let mut errors = Vec::new();
        let selected = match env::var_os(ALLOCATOR_ENV) {
            Some(v) if !v.is_empty() => Some(v.to_string_lossy().trim().to_owned()),
            _ => None,
        };
        let cpu: Arc<dyn Allocator> = Arc::new(SystemAllocator::new());
        #[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
        let default_backend: Arc<dyn Allocator> = Arc::new(crate::allocators::JemallocAllocator::new());
        #[cfg(not(all(feature = "jemalloc", not(target_env = "msvc"))))]
        let default_backend: Arc<dyn Allocator> = Arc::clone(&cpu);
        let mut builtin: Vec<(&str, i32, Arc<dyn Allocator>)> = vec![("cpu", 0, cpu)];
        if cfg!(all(feature = "jemalloc", not(target_env = "msvc"))) {
            builtin.push(("jemalloc", 50, Arc::clone(&default_backend)));
        }
        match AllocConf::from_env() {
            Err(e) => errors.push(RegistryError::Config(e)),
            Ok(conf) => {
                match conf.build_pool(default_backend) {
                    Ok(pool) => builtin.push(("pool", DEFAULT_PRIORITY, Arc::new(pool))),
                    Err(e) => errors.push(RegistryError::Config(e)),
                }
                let wants_bfc = selected.as_deref().is_some_and(|s| s.eq_ignore_ascii_case("bfc"));
                if conf.configures_bfc() || wants_bfc {
                    match conf.build_bfc() {
                        Ok(bfc) => builtin.push(("bfc", CONFIGURED_PRIORITY, Arc::new(bfc))),
                        Err(e) => errors.push(RegistryError::Config(e)),
                    }
                }
            }
        }
        #[cfg(feature = "cuda")]
        if let Ok(conf) = AllocConf::from_env() {
            let (devices, device_errors) = crate::device::entries(&conf);
            errors.extend(device_errors);
            for (name, allocator) in devices {
                if let Err(e) = registry.register(&name, DEVICE_PRIORITY, allocator) {
                    errors.push(e);
                }
            }
        }
        let mut factories: Vec<&AllocatorFactory> = inventory::iter::<AllocatorFactory>().collect();
        // Link order is arbitrary; registering in name order keeps tie-breaks reproducible.
        factories.sort_by_key(|f| (f.name, f.priority));
        for (name, priority, allocator) in builtin {
            if let Err(e) = registry.register(name, priority, allocator) {
                errors.push(e);
            }
        }
        for f in factories {
            if let Err(e) = registry.register_factory(f.name, f.priority, (f.make)()) {
                errors.push(e);
            }
        }
        let mut inner = registry.inner.write();
        inner.startup_errors = errors;
        inner.selected = selected.map(|name| (name, SelectionOrigin::Environment));
        inner.configured_from_env = true;
        drop(inner);
        match registry.try_get() {
            Ok(a) => match registry.selected() {
                Some(name) => {
                    tracing::info!(allocator = a.name(), %name, origin = ALLOCATOR_ENV, "tensormem: default allocator")
                }
                None => tracing::info!(allocator = a.name(), origin = "priority", "tensormem: default allocator"),
            },
            Err(error) => tracing::error!(%error, "tensormem: no default allocator"),
        }
        let mut registry = registry;
        registry.is_global = true;
        registry
    }

    /// Registers `allocator` under `name` with `priority` (see the type's docs for names that
    /// are already registered and for ties).
    ///
    /// # Errors
    /// [`RegistryError::Duplicate`] if the name (compared case-insensitively) is already
    /// registered at the same priority (naming both registrations), [`RegistryError::EmptyName`]
    /// for an empty name.
    pub fn register(&self, name: &str, priority: i32, allocator: Arc<dyn Allocator>) -> Result<(), RegistryError> {
        let mut inner = self.inner.write();
        inner.attempts += 1;
        if name.is_empty() {
            return Err(RegistryError::EmptyName { priority });
        }
        if let Some(first) = inner.entries.iter().position(|e| e.name.eq_ignore_ascii_case(name)) {
            let old = &inner.entries[first];
            if old.priority == priority {
                return Err(RegistryError::Duplicate {
                    name: name.to_owned(),
                    priority,
                    first_index: first + 1,
                    first_allocator: old.allocator.name().to_owned(),
                    second_index: inner.attempts,
                    second_allocator: allocator.name().to_owned(),
                });
            }
            tracing::warn!(
                name,
                old_priority = old.priority,
                new_priority = priority,
                old_allocator = old.allocator.name(),
                new_allocator = allocator.name(),
                "tensormem: allocator '{name}' is registered again at priority {priority}: it replaces the one at \
                 priority {}",
                old.priority
            );
            inner.entries.remove(first);
        }
        let top = inner.entries.iter().map(|e| e.priority).max();
        let same = |e: &RegistryEntry| Arc::as_ptr(&e.allocator).cast::<()>() == Arc::as_ptr(&allocator).cast::<()>();
        if top == Some(priority)
            && let Some(chosen) = inner.entries.iter().find(|e| e.priority == priority && !same(e))
        {
            tracing::warn!(
                name,
                priority,
                chosen = %chosen.name,
                "tensormem: allocator '{name}' ties with '{}' at the top priority {priority}: get() keeps returning \
                 '{}' (registered first); register '{name}' with a higher priority to make it the default",
                chosen.name,
                chosen.name
            );
        }
        inner.entries.push(RegistryEntry { name: name.to_owned(), priority, allocator });
        Ok(())
    }

    /// A `register_allocator!` registration: as [`register`](Self::register), and the
    /// allocator must report the name it is registered under.
    fn register_factory(&self, name: &str, priority: i32, allocator: Arc<dyn Allocator>) -> Result<(), RegistryError> {
        if !allocator.name().eq_ignore_ascii_case(name) {
            return Err(RegistryError::NameMismatch {
                registered: name.to_owned(),
                reported: allocator.name().to_owned(),
            });
        }
        self.register(name, priority, allocator)
    }

    /// The selected allocator if one was chosen by name, else the one with the highest priority
    /// (the first registered on a tie).
    ///
    /// # Panics
    /// With the message of the error [`try_get`](Self::try_get) would return: when the registry
    /// is empty, when the chosen name is not registered, or when a startup registration failed.
    /// Use `try_get` to handle these at startup.
    pub fn get(&self) -> Arc<dyn Allocator> {
        match self.try_get() {
            Ok(a) => a,
            Err(e) => panic!("{e}"),
        }
    }

    /// The allocator for memory with `attrs`, as TensorFlow's `GetAllocator(attr)`: pinned host
    /// memory (`on_host` and `gpu_compatible`, or `gpu_compatible` alone) from `cuda_host` when
    /// it is registered (feature `cuda` with a driver); everything else, and pinned memory on a
    /// machine without CUDA, from [`try_get`](Self::try_get).
    ///
    /// ```
    /// use tensormem::{AllocatorAttributes, AllocatorRegistry};
    /// let pinned = AllocatorAttributes::new().with_on_host(true).with_gpu_compatible(true);
    /// let a = AllocatorRegistry::global().get_for(&pinned)?;
    /// // Without a CUDA driver, the host default serves it.
    /// # if AllocatorRegistry::global().get_by_name("cuda_host").is_none() {
    /// assert_eq!(a.name(), AllocatorRegistry::global().get().name());
    /// # }
    /// # Ok::<(), tensormem::RegistryError>(())
    /// ```
    ///
    /// # Errors
    /// As [`try_get`](Self::try_get).
    pub fn get_for(&self, attrs: &crate::AllocatorAttributes) -> Result<Arc<dyn Allocator>, RegistryError> {
        if attrs.gpu_compatible()
            && let Some(a) = self.get_by_name("cuda_host")
        {
            return Ok(a);
        }
        self.try_get()
    }

    /// The registered allocator of a memory space: the default for host memory, `cuda_host` for
    /// pinned host memory, `cuda:N` for device N; `None` when there is none.
    pub fn get_for_space(&self, space: crate::allocators::MemorySpace) -> Option<Arc<dyn Allocator>> {
        use crate::allocators::MemorySpace;
        match space {
            MemorySpace::Host => self.try_get().ok(),
            MemorySpace::HostPinned => self.get_by_name("cuda_host"),
            MemorySpace::Device { ordinal } => self.get_by_name(&format!("cuda:{ordinal}")),
        }
    }

    /// Like [`get`](Self::get), but reports a misconfiguration instead of panicking.
    ///
    /// On the global registry, inside [`with_default_allocator`](crate::with_default_allocator)
    /// both return that call's allocator on its thread.
    ///
    /// # Errors
    /// [`RegistryError::UnknownAllocator`] when the chosen name (from `TENSORMEM_ALLOCATOR` or
    /// [`select`](Self::select)) is not registered, listing the registered names;
    /// [`RegistryError::Empty`] when nothing is registered; the first startup registration
    /// error of the global registry, if any.
    pub fn try_get(&self) -> Result<Arc<dyn Allocator>, RegistryError> {
        if self.is_global
            && let Some(a) = crate::observation::scope::default_override()
        {
            return Ok(a);
        }
        let inner = self.inner.read();
        if let Some(e) = inner.startup_errors.first() {
            return Err(e.clone());
        }
        if let Some((name, origin)) = &inner.selected {
            return Self::by_name(&inner, name).ok_or_else(|| Self::unknown(&inner, name, *origin));
        }
        let mut best: Option<&RegistryEntry> = None;
        for e in &inner.entries {
            if best.is_none_or(|b| e.priority > b.priority) {
                best = Some(e);
            }
        }
        best.map(|e| Arc::clone(&e.allocator)).ok_or(RegistryError::Empty)
    }

    /// The allocator registered under `name` (an exact match first, else a case-insensitive
    /// one), or `None`.
    pub fn get_by_name(&self, name: &str) -> Option<Arc<dyn Allocator>> {
        Self::by_name(&self.inner.read(), name)
    }

    /// Chooses the allocator [`get`](Self::get) returns by name, whatever the priorities;
    /// `None` goes back to choosing by priority.
    ///
    /// # Errors
    /// [`RegistryError::UnknownAllocator`] if `name` is not registered; the choice is unchanged.
    pub fn select(&self, name: Option<&str>) -> Result<(), RegistryError> {
        let mut inner = self.inner.write();
        match name {
            None => inner.selected = None,
            Some(name) => {
                if Self::by_name(&inner, name).is_none() {
                    return Err(Self::unknown(&inner, name, SelectionOrigin::Code));
                }
                inner.selected = Some((name.to_owned(), SelectionOrigin::Code));
            }
        }
        Ok(())
    }

    /// The name chosen by [`select`](Self::select) or `TENSORMEM_ALLOCATOR`, if any.
    pub fn selected(&self) -> Option<String> {
        self.inner.read().selected.as_ref().map(|(n, _)| n.clone())
    }

    /// Gives cached memory back from every registered allocator (TensorFlow's `ClearCache`,
    /// PyTorch's `empty_cache`), each allocator once even when registered under several names;
    /// returns the bytes given back. Live blocks are untouched.
    pub fn release_cached(&self) -> usize {
        let mut seen: Vec<*const ()> = Vec::new();
        let mut released = 0;
        for e in self.entries() {
            let key = Arc::as_ptr(&e.allocator).cast::<()>();
            if !seen.contains(&key) {
                seen.push(key);
                released += e.allocator.release_cached();
            }
        }
        released
    }

    /// Every registration, in registration order.
    pub fn entries(&self) -> Vec<RegistryEntry> {
        self.inner.read().entries.clone()
    }

    /// The highest-priority registration named `name` exactly, else case-insensitively.
    fn by_name(inner: &Inner, name: &str) -> Option<Arc<dyn Allocator>> {
        let best = |matches: &dyn Fn(&str) -> bool| {
            let mut best: Option<&RegistryEntry> = None;
            for e in inner.entries.iter().filter(|e| matches(&e.name)) {
                if best.is_none_or(|b| e.priority > b.priority) {
                    best = Some(e);
                }
            }
            best.map(|e| Arc::clone(&e.allocator))
        };
        best(&|n| n == name).or_else(|| best(&|n| n.eq_ignore_ascii_case(name)))
    }

    fn unknown(inner: &Inner, name: &str, origin: SelectionOrigin) -> RegistryError {
        let mut entries: Vec<&RegistryEntry> = inner.entries.iter().collect();
        entries.sort_by_key(|e| std::cmp::Reverse(e.priority));
        let mut registered: Vec<String> = Vec::new();
        for e in entries {
            if !registered.contains(&e.name) {
                registered.push(e.name.clone());
            }
        }
        let configurable = if inner.configured_from_env {
            CONFIGURABLE
                .iter()
                .filter(|(n, _)| !registered.iter().any(|r| r == n))
                .map(|(n, how)| format!("{n} (configure it with {how})"))
                .collect()
        } else {
            Vec::new()
        };
        RegistryError::UnknownAllocator { requested: name.to_owned(), origin, registered, configurable }
    }
}

// Every mutation under the lock completes before any user code (an allocator's `name()`) can
// panic, so a caught panic never leaves the registry half-updated.
impl std::panic::RefUnwindSafe for AllocatorRegistry {}
impl std::panic::UnwindSafe for AllocatorRegistry {}

impl Default for AllocatorRegistry {
    fn default() -> Self {
        Self::new()
    }
}

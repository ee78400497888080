//! [`Tag`]: an interned scope path, four bytes wide, so that every allocation can carry one.

use core::fmt;
use core::num::NonZeroU32;
use std::collections::HashMap;
use std::sync::OnceLock;

use parking_lot::RwLock;

/// A scope path such as `encoder.layer3/attn` (or an allocator's name), interned for the life of
/// the process.
///
/// Tags are what [`scope`](crate::observe::scope()) attaches to allocations; they are interned
/// once so that an allocation record, a tracking chunk or a history event holds four bytes
/// instead of a string. Leak records and history events keep their allocator's name the same way. Interned strings are never freed: use a bounded set of tags (layer and
/// phase names, as for metric labels), not one per request.
///
/// ```
/// use tensormem_allocators::observe::Tag;
///
/// let t = Tag::intern("decoder/attn");
/// assert_eq!(t.as_str(), "decoder/attn");
/// assert_eq!(Tag::intern("decoder/attn"), t);
/// assert_eq!(t.to_string(), "decoder/attn");
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tag(NonZeroU32);

#[derive(Default)]
struct Interner {
    ids: HashMap<&'static str, Tag>,
    names: Vec<&'static str>,
}

fn interner() -> &'static RwLock<Interner> {
    static INTERNER: OnceLock<RwLock<Interner>> = OnceLock::new();
    INTERNER.get_or_init(Default::default)
}

impl Tag {
    /// The tag for `path`, interning it on first use.
    pub fn intern(path: &str) -> Tag {
        if let Some(&t) = interner().read().ids.get(path) {
            return t;
        }
        // The interner's own allocations are not the program's, and the observer interns too.
        super::unobserved(|| Self::insert(path))
    }

    fn insert(path: &str) -> Tag {
        let mut w = interner().write();
        if let Some(&t) = w.ids.get(path) {
            return t;
        }
        let name: &'static str = Box::leak(path.to_owned().into_boxed_str());
        w.names.push(name);
        // Ids start at 1; more than u32::MAX distinct tags would have exhausted memory first.
        let id = u32::try_from(w.names.len()).ok().and_then(NonZeroU32::new).unwrap_or(NonZeroU32::MAX);
        let tag = Tag(id);
        w.ids.insert(name, tag);
        tag
    }

    /// The path this tag stands for.
    pub fn as_str(self) -> &'static str {
        interner().read().names.get(self.0.get() as usize - 1).copied().unwrap_or("")
    }

    /// The tag's number (from 1), for compact storage; [`from_raw`](Self::from_raw) inverts it.
    pub fn to_raw(self) -> u32 {
        self.0.get()
    }

    /// The tag numbered `raw`, if one was interned with that number (0 means no tag).
    pub fn from_raw(raw: u32) -> Option<Tag> {
        let id = NonZeroU32::new(raw)?;
        (interner().read().names.len() >= raw as usize).then_some(Tag(id))
    }
}

impl fmt::Debug for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tag({:?})", self.as_str())
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for Tag {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for Tag {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(d)?;
        Ok(Tag::intern(&s))
    }
}

//! [`History::to_pprof`]: a history as a pprof profile (gzipped protobuf, `profile.proto` of
//! github.com/google/pprof), read by `go tool pprof`, speedscope and the other pprof viewers.
//!
//! Each allocation of the history is a sample whose stack is its recorded backtrace (tensormem's
//! own frames trimmed from the top, as in leak reports); an allocation recorded without one
//! stands on its scope path (`layer0/attn` becomes the frames `layer0` <- `attn`) under a frame
//! `(no backtrace)`. Samples with the same stack and allocator are summed. Values: the bytes it
//! held at the history's peak ([`History::peak`]; 0 when not live there), then the bytes
//! allocated.

use std::collections::HashMap;
use std::io::Write;

use super::History;
use crate::allocators::observe::Action;

/// The sample types, in value order: `(type, unit)`.
pub const PPROF_SAMPLE_TYPES: [(&str, &str); 2] = [("live_bytes_at_peak", "bytes"), ("bytes_allocated", "bytes")];

/// One stack frame: function name, file and line (0: not known).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Frame {
    pub(crate) function: String,
    file: String,
    line: u64,
}

/// The frames of a backtrace in `std::backtrace::Backtrace`'s format, innermost first, each
/// with its first location.
pub(crate) fn frames_of(backtrace: &str) -> Vec<Frame> {
    let frames = crate::observation::backtrace::frames(backtrace).unwrap_or_default();
    frames
        .into_iter()
        .map(|(function, rest)| {
            let at = rest.iter().find_map(|l| l.trim().strip_prefix("at "));
            // `file:line:column`; the file may itself hold colons.
            let mut parts = at.unwrap_or("").rsplitn(3, ':');
            let (_column, line, file) = (parts.next(), parts.next(), parts.next());
            match (file, line.and_then(|l| l.parse().ok())) {
                (Some(file), Some(line)) => Frame { function, file: file.to_owned(), line },
                _ => Frame { function, file: at.unwrap_or("").to_owned(), line: 0 },
            }
        })
        .collect()
}

/// The stack of an allocation recorded without a backtrace: its scope path, innermost first,
/// under `(no backtrace)`.
pub(crate) fn scope_frames(tag: Option<&str>) -> Vec<Frame> {
    let frame = |name: &str| Frame { function: name.to_owned(), file: String::new(), line: 0 };
    let mut frames: Vec<Frame> = tag.map(|t| t.split('/').rev().map(frame).collect()).unwrap_or_default();
    frames.push(frame("(no backtrace)"));
    frames
}

/// The stack of an allocation, innermost first: its backtrace's frames, or else its scope path.
pub(crate) fn stack_of(backtrace: Option<&str>, tag: Option<&str>) -> Vec<Frame> {
    match backtrace.map(frames_of) {
        Some(frames) if !frames.is_empty() => frames,
        _ => scope_frames(tag),
    }
}

/// Protobuf wire encoding, just what `profile.proto` needs.
#[derive(Default)]
struct Message(Vec<u8>);

impl Message {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    /// A varint field (skipped when 0, the default).
    fn uint(&mut self, field: u32, v: u64) {
        if v != 0 {
            self.varint(u64::from(field) << 3);
            self.varint(v);
        }
    }

    /// A length-delimited field.
    fn bytes(&mut self, field: u32, b: &[u8]) {
        self.varint((u64::from(field) << 3) | 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
    }

    /// A packed repeated varint field.
    fn packed(&mut self, field: u32, vs: impl IntoIterator<Item = u64>) {
        let mut inner = Message::default();
        vs.into_iter().for_each(|v| inner.varint(v));
        self.bytes(field, &inner.0);
    }
}

/// Strings by index; index 0 is "" as the format requires.
struct Strings {
    index: HashMap<String, u64>,
    list: Vec<String>,
}

impl Strings {
    fn new() -> Self {
        Strings { index: HashMap::from([(String::new(), 0)]), list: vec![String::new()] }
    }

    fn id(&mut self, s: &str) -> u64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.list.len() as u64;
        self.index.insert(s.to_owned(), i);
        self.list.push(s.to_owned());
        i
    }
}

impl History {
    /// The history as a gzipped pprof profile (`profile.proto` of github.com/google/pprof):
    /// `go tool pprof -top heap.pb.gz` lists where the memory live at the peak was allocated,
    /// `-sample_index=bytes_allocated` where bytes were allocated at all.
    ///
    /// Each allocation is a sample whose stack is its recorded backtrace (tensormem's own frames
    /// trimmed from the top); one recorded without a backtrace stands on its scope path
    /// (`layer0/attn` becomes `attn` called from `layer0`) under a frame `(no backtrace)`.
    /// Samples with the same stack and allocator are summed, with the label `allocator`. The
    /// values are [`PPROF_SAMPLE_TYPES`]: the bytes it held at the peak ([`History::peak`]; 0
    /// when not live there), then the bytes allocated.
    pub fn to_pprof(&self) -> Vec<u8> {
        let live_at_peak: std::collections::HashSet<usize> =
            self.peak().map(|p| p.allocations.iter().filter_map(|a| a.event).collect()).unwrap_or_default();
        // Samples summed by (stack, allocator).
        let mut samples: HashMap<(Vec<Frame>, &str), [u64; 2]> = HashMap::new();
        for (i, e) in self.events.iter().enumerate().filter(|(_, e)| e.action == Action::Alloc) {
            let stack = stack_of(e.backtrace.as_deref(), e.tag.as_deref());
            let v = samples.entry((stack, &*e.allocator)).or_default();
            if live_at_peak.contains(&i) {
                v[0] = v[0].saturating_add(e.size);
            }
            v[1] = v[1].saturating_add(e.size);
        }
        let mut strings = Strings::new();
        let mut functions: HashMap<(String, String), u64> = HashMap::new();
        let mut locations: HashMap<Frame, u64> = HashMap::new();
        let mut profile = Message::default();
        for (kind, unit) in PPROF_SAMPLE_TYPES {
            let mut vt = Message::default();
            vt.uint(1, strings.id(kind));
            vt.uint(2, strings.id(unit));
            profile.bytes(1, &vt.0);
        }
        let allocator_key = strings.id("allocator");
        // Sorted, so that the same history always gives the same bytes.
        let mut samples: Vec<_> = samples.into_iter().collect();
        samples.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.1.cmp(b.0.1)).then_with(|| a.0.0.cmp(&b.0.0)));
        let mut location_msgs = Vec::new();
        let mut function_msgs = Vec::new();
        for ((stack, allocator), values) in &samples {
            let mut ids = Vec::with_capacity(stack.len());
            for frame in stack {
                let next = locations.len() as u64 + 1;
                let id = *locations.entry(frame.clone()).or_insert_with(|| {
                    let fkey = (frame.function.clone(), frame.file.clone());
                    let next_f = functions.len() as u64 + 1;
                    let fid = *functions.entry(fkey).or_insert_with(|| {
                        let mut f = Message::default();
                        f.uint(1, next_f);
                        f.uint(2, strings.id(&frame.function));
                        f.uint(3, strings.id(&frame.function));
                        f.uint(4, strings.id(&frame.file));
                        function_msgs.push(f.0);
                        next_f
                    });
                    let mut line = Message::default();
                    line.uint(1, fid);
                    line.uint(2, frame.line);
                    let mut loc = Message::default();
                    loc.uint(1, next);
                    loc.bytes(4, &line.0);
                    location_msgs.push(loc.0);
                    next
                });
                ids.push(id);
            }
            let mut sample = Message::default();
            sample.packed(1, ids);
            sample.packed(2, values.iter().copied());
            let mut label = Message::default();
            label.uint(1, allocator_key);
            label.uint(2, strings.id(allocator));
            sample.bytes(3, &label.0);
            profile.bytes(2, &sample.0);
        }
        location_msgs.iter().for_each(|l| profile.bytes(4, l));
        function_msgs.iter().for_each(|f| profile.bytes(5, f));
        for s in &strings.list {
            profile.bytes(6, s.as_bytes());
        }
        profile.uint(9, self.start_unix_ms.saturating_mul(1_000_000));
        let duration = self.events.last().map_or(0, |e| e.time_ns);
        profile.uint(10, duration);
        // default_sample_type: live_bytes_at_peak.
        profile.uint(14, strings.index[PPROF_SAMPLE_TYPES[0].0]);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        // Writing into a `Vec` cannot fail.
        let _ = gz.write_all(&profile.0);
        gz.finish().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backtrace_frames_are_parsed_innermost_first() {
        let bt = "   0: app::load_weights\n             at ./src/model.rs:42:9\n   1: app::main\n             at \
                  ./src/main.rs:7:5\n             at ./src/inlined.rs:1:1\n   2: std::rt::lang_start\n";
        let f = frames_of(bt);
        assert_eq!(f.len(), 3);
        assert_eq!(
            (f[0].function.as_str(), f[0].file.as_str(), f[0].line),
            ("app::load_weights", "./src/model.rs", 42)
        );
        assert_eq!((f[1].file.as_str(), f[1].line), ("./src/main.rs", 7), "the first location of a frame");
        assert_eq!((f[2].file.as_str(), f[2].line), ("", 0));
        let s: Vec<String> = scope_frames(Some("decoder/layer0")).into_iter().map(|f| f.function).collect();
        assert_eq!(s, ["layer0", "decoder", "(no backtrace)"]);
    }

    #[test]
    fn varints_and_fields_encode_as_protobuf_does() {
        let mut m = Message::default();
        m.uint(1, 150);
        assert_eq!(m.0, [0x08, 0x96, 0x01]);
        let mut m = Message::default();
        m.bytes(2, b"testing");
        assert_eq!(m.0, [0x12, 0x07, b't', b'e', b's', b't', b'i', b'n', b'g']);
        let mut m = Message::default();
        m.packed(4, [3, 270, 86942]);
        assert_eq!(m.0, [0x22, 0x06, 0x03, 0x8E, 0x02, 0x9E, 0xA7, 0x05]);
        let mut m = Message::default();
        m.uint(3, 0);
        assert!(m.0.is_empty(), "defaults are not written");
    }
}

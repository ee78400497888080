//! `Display` for tensors, printing like PyTorch: `tensor([[0.3091, 0.5503], ...])`.
//!
//! Floats print with 4 decimals (`0.3091`), or as `1.` when every value is an integer, or
//! in scientific notation (`1.0000e+08`) when the values span more than three orders of
//! magnitude; columns are right-aligned to one width; rows wrap at 80 characters; more than
//! 1000 elements are summarised with the first and last 3 of each dimension around `...`.
//! A dtype other than f32, i64 and bool is named after the values (`dtype=f64`).

use core::fmt;

use super::dtype::match_dtype;
use super::storage::lock_storages;
use super::{DType, Element, Tensor};

const THRESHOLD: usize = 1000;
const EDGE: usize = 3;
const LINE_WIDTH: usize = 80;
/// The most dimensions printed nested. Each dimension is a level of brackets (and of the
/// walk over them), and a legal tensor can have hundreds of thousands of size-1 dimensions: past
/// this (PyTorch's own cap on dimensions) the tensor is described instead, in time linear in its
/// dimensions, so printing never exhausts the stack.
const MAX_NESTED_DIMS: usize = 64;

#[derive(Clone, Copy)]
enum Value {
    F(f64),
    I(i64),
    B(bool),
}

/// The displayed indices of a dimension of `size` (`None` marks the `...`).
fn shown(size: usize, summarize: bool) -> Vec<Option<usize>> {
    if summarize && size > 2 * EDGE {
        (0..EDGE).map(Some).chain([None]).chain((size - EDGE..size).map(Some)).collect()
    } else {
        (0..size).map(Some).collect()
    }
}

fn collect(t: &Tensor, summarize: bool) -> Vec<Value> {
    let mut out = Vec::new();
    let read = |off: usize| -> Value {
        match_dtype!(t.dtype(), T => {
            // SAFETY: `off` is an element of the view (built from its sizes and strides),
            // inside the materialised, read-locked storage; `T` is the tensor's dtype.
            let v: T = unsafe { (t.data_ptr() as *const T).add(off).read() };
            match T::DTYPE {
                DType::Bool => Value::B(v.to_i64() != 0),
                d if d.is_floating_point() => Value::F(v.to_f64()),
                _ => Value::I(v.to_i64()),
            }
        }, _ => Value::F(f64::NAN))
    };
    fn walk(t: &Tensor, d: usize, off: usize, summarize: bool, read: &dyn Fn(usize) -> Value, out: &mut Vec<Value>) {
        if d == t.dim() {
            out.push(read(off));
            return;
        }
        for i in shown(t.sizes()[d], summarize).into_iter().flatten() {
            walk(t, d + 1, off + i * t.strides()[d], summarize, read, out);
        }
    }
    walk(t, 0, 0, summarize, &read, &mut out);
    out
}

/// PyTorch's scientific format: `1.2346e+05`.
fn sci(v: f64) -> String {
    let s = format!("{v:.4e}");
    match s.split_once('e') {
        Some((m, e)) => {
            let (sign, digits) = if let Some(d) = e.strip_prefix('-') { ('-', d) } else { ('+', e) };
            format!("{m}e{sign}{digits:0>2}")
        }
        None => s,
    }
}

/// Formats every value the way PyTorch's `_Formatter` would for this set of values.
fn format_all(values: &[Value]) -> Vec<String> {
    let finite: Vec<f64> = values
        .iter()
        .filter_map(|v| match v {
            Value::F(x) if x.is_finite() => Some(*x),
            _ => None,
        })
        .collect();
    let nonzero: Vec<f64> = finite.iter().map(|x| x.abs()).filter(|&x| x != 0.0).collect();
    let int_mode = finite.iter().all(|x| x.fract() == 0.0);
    let (min, max) = nonzero.iter().fold((f64::INFINITY, 0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    let sci_mode = !nonzero.is_empty()
        && if int_mode { max / min > 1000.0 || max > 1e8 } else { max / min > 1000.0 || max > 1e8 || min < 1e-4 };
    values
        .iter()
        .map(|v| match *v {
            Value::B(b) => if b { "True" } else { "False" }.to_string(),
            Value::I(i) => i.to_string(),
            Value::F(x) if x.is_nan() => "nan".to_string(),
            Value::F(x) if x.is_infinite() => if x > 0.0 { "inf" } else { "-inf" }.to_string(),
            Value::F(x) if sci_mode => sci(x),
            Value::F(x) if int_mode => format!("{x:.0}."),
            Value::F(x) => format!("{x:.4}"),
        })
        .collect()
}

struct Printer<'a> {
    t: &'a Tensor,
    cells: Vec<String>,
    next: usize,
    width: usize,
    summarize: bool,
}

impl Printer<'_> {
    fn cell(&mut self) -> String {
        let s = &self.cells[self.next];
        self.next += 1;
        format!("{s:>w$}", w = self.width)
    }

    fn dim(&mut self, d: usize, indent: usize, out: &mut String) {
        out.push('[');
        let idx = shown(self.t.sizes()[d], self.summarize);
        if d + 1 == self.t.dim() {
            let per_line = ((LINE_WIDTH.saturating_sub(indent)) / (self.width + 2)).max(1);
            let mut on_line = 0;
            for (n, i) in idx.iter().enumerate() {
                if n > 0 {
                    out.push(',');
                    if on_line == per_line {
                        out.push('\n');
                        out.push_str(&" ".repeat(indent + 1));
                        on_line = 0;
                    } else {
                        out.push(' ');
                    }
                }
                match i {
                    Some(_) => out.push_str(&self.cell()),
                    None => out.push_str(" ..."),
                }
                on_line += 1;
            }
        } else {
            let sep = format!(",{}{}", "\n".repeat(self.t.dim() - d - 1), " ".repeat(indent + 1));
            for (n, i) in idx.iter().enumerate() {
                if n > 0 {
                    out.push_str(&sep);
                }
                match i {
                    Some(_) => self.dim(d + 1, indent + 1, out),
                    None => out.push_str("..."),
                }
            }
        }
        out.push(']');
    }
}

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.dim() > MAX_NESTED_DIMS {
            let sizes = self.sizes();
            let head: Vec<String> = sizes.iter().take(4).map(usize::to_string).collect();
            return write!(
                f,
                "tensor(<{}-dimensional tensor of shape [{}, ..., {}] ({} elements), dtype {}: more than \
                 {MAX_NESTED_DIMS} dimensions are not printed nested; reshape it to print its values>)",
                self.dim(),
                head.join(", "),
                sizes.last().copied().unwrap_or(0),
                self.numel(),
                self.dtype()
            );
        }
        // A device tensor is shown from a host copy, as PyTorch prints CUDA tensors.
        let device = self.storage().memory_space();
        let host = if device.is_host_accessible() {
            self.clone()
        } else {
            match crate::core::default_allocator("display").and_then(|host| self.to_allocator(&host)) {
                Ok(t) => t,
                Err(e) => return write!(f, "tensor(<{e}>)"),
            }
        };
        let t = if host.dtype().is_quantized() {
            match host.to_dtype(DType::F32) {
                Ok(t) => t,
                Err(e) => return write!(f, "tensor(<{e}>)"),
            }
        } else {
            host
        };
        if let Err(e) = t.host_ready("display") {
            return write!(f, "tensor(<{e}>)");
        }
        let summarize = t.numel() > THRESHOLD;
        // An empty tensor shows no values, whatever its other dimensions (O(1)).
        let values = if t.numel() == 0 {
            Vec::new()
        } else {
            let _g = match lock_storages("display", None, &[t.storage()]) {
                Ok(g) => g,
                Err(e) => return write!(f, "tensor(<{e}>)"),
            };
            collect(&t, summarize)
        };
        let cells = format_all(&values);
        // PyTorch's width: floats are aligned to their nonzero finite values (zeros and
        // non-finite values do not widen the column, which is at least 1 wide); integers and
        // bools to every value.
        let width = values
            .iter()
            .zip(&cells)
            .filter(|(v, _)| !matches!(v, Value::F(x) if *x == 0.0 || !x.is_finite()))
            .map(|(_, c)| c.len())
            .fold(1, usize::max);
        let mut out = String::from("tensor(");
        let mut suffixes = Vec::new();
        if t.numel() == 0 {
            out.push_str("[]");
            if t.dim() != 1 {
                let sizes: Vec<String> = t.sizes().iter().map(|s| s.to_string()).collect();
                suffixes.push(format!("size=({})", sizes.join(", ")));
            }
        } else if t.dim() == 0 {
            out.push_str(&cells[0]);
        } else {
            Printer { t: &t, cells, next: 0, width, summarize }.dim(0, 7, &mut out);
        }
        // The dtype is said unless the values imply it: f32 (the default), or i64 and bool
        // when there are values to show it (an empty tensor shows none).
        let implied = match self.dtype() {
            DType::F32 => true,
            DType::I64 | DType::Bool => t.numel() > 0,
            _ => false,
        };
        if !implied {
            suffixes.push(format!("dtype={}", self.dtype()));
        }
        if !device.is_host_accessible() {
            suffixes.push(format!("device='{device}'"));
        }
        // PyTorch's `_add_suffixes`: a suffix that would take its line past 80 columns starts a
        // line of its own, indented under the values. `last` counts as PyTorch's does (the
        // last line's length plus 2 until a suffix starts a line).
        let mut last = out.len() - out.rfind('\n').map_or(0, |i| i + 1) + 2;
        for suffix in suffixes {
            if last + suffix.len() + 2 > LINE_WIDTH {
                out.push_str(",\n       ");
                last = 7 + suffix.len();
            } else {
                out.push_str(", ");
                last += suffix.len() + 2;
            }
            out.push_str(&suffix);
        }
        out.push(')');
        f.write_str(&out)
    }
}

//! The tensormem side of `tensor/tools/torchdiff.py`, which tests tensors against PyTorch.
//!
//! Reads one case per line on stdin and writes one result per line on stdout, as JSON:
//! - case: `{"id", "op", "inputs": [{"dtype", "base": ["1.5", "inf", ...], "sizes", "strides",
//!   "offset"} | {"alias": k, "sizes", "strides", "offset"}], "args": {...}}`: each input is a
//!   view (`as_strided`) of a 1-D base of the given values (as strings, for the non-finite
//!   ones), or of input `k`'s base;
//! - result: `{"id", "ok": true, "r": {"out": [{"dtype", "sizes", "values"}]}}` (for in-place
//!   and `out=` forms, every input's base after the op), `{"r": {"text"}}` for Display,
//!   `{"ok": false, "err"}` for an error, `"panic": true` for a panic.
//!
//! ```text
//! cargo build --release --all-features --example torchdiff
//! python3 tensor/tools/torchdiff.py --seed 1 --cases 5000   # with PyTorch installed
//! ```
use serde_json::{Value, json};
use std::io::{BufRead, Write};
use tensormem_tensor::{DType, SafeTensors, Scalar, Tensor, TensorOptions, save_safetensors};

fn dtype(s: &str) -> DType {
    match s {
        "bool" => DType::Bool,
        "u8" => DType::U8,
        "i8" => DType::I8,
        "i16" => DType::I16,
        "i32" => DType::I32,
        "i64" => DType::I64,
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        "f32" => DType::F32,
        "f64" => DType::F64,
        _ => panic!("dtype {s}"),
    }
}

fn build(v: &Value) -> Result<(Tensor, Tensor), String> {
    let base: Vec<f64> =
        v["base"].as_array().unwrap().iter().map(|x| x.as_str().unwrap().parse::<f64>().unwrap()).collect();
    let n = base.len();
    let dt = dtype(v["dtype"].as_str().unwrap());
    let b = Tensor::from_vec(base, &[n], DType::F64).map_err(|e| format!("build: {e}"))?;
    let b = b.to_dtype(dt).map_err(|e| format!("build: {e}"))?;
    let sizes: Vec<usize> = v["sizes"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
    let strides: Vec<usize> = v["strides"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
    let off = v["offset"].as_u64().unwrap() as usize;
    let view = b.as_strided(&sizes, &strides, off).map_err(|e| format!("build: {e}"))?;
    Ok((b, view))
}

fn vals(t: &Tensor) -> Result<Vec<String>, String> {
    let v =
        t.to_dtype(DType::F64).map_err(|e| format!("vals: {e}"))?.to_vec::<f64>().map_err(|e| format!("vals: {e}"))?;
    Ok(v.iter().map(|x| format!("{x:?}")).collect())
}

fn desc(t: &Tensor) -> Result<Value, String> {
    Ok(json!({"dtype": t.dtype().name(), "sizes": t.sizes(), "values": vals(t)?, "layout": t.strides()}))
}

/// A view's description also gives its layout and whether it shares `base`'s storage.
fn desc_view(t: &Tensor, base: &Tensor) -> Result<Value, String> {
    let mut d = desc(t)?;
    d["strides"] = json!(t.strides());
    d["offset"] = json!(t.storage_offset());
    d["shares"] = json!(t.shares_storage(base));
    Ok(d)
}

fn scalar(v: &Value) -> Scalar {
    match v["kind"].as_str().unwrap() {
        "bool" => Scalar::Bool(v["v"].as_bool().unwrap()),
        "int" => Scalar::Int(v["v"].as_i64().unwrap()),
        _ => Scalar::Float(v["v"].as_f64().unwrap()),
    }
}

fn i(v: &Value) -> isize {
    v.as_i64().unwrap() as isize
}
fn u(v: &Value) -> usize {
    v.as_u64().unwrap() as usize
}
fn us(v: &Value) -> Vec<usize> {
    v.as_array().unwrap().iter().map(u).collect()
}
fn is(v: &Value) -> Vec<isize> {
    v.as_array().unwrap().iter().map(i).collect()
}

fn run(case: &Value) -> Result<Value, String> {
    let mut built: Vec<(Tensor, Tensor)> = Vec::new();
    for v in case["inputs"].as_array().unwrap() {
        if let Some(j) = v["alias"].as_u64() {
            let b = built[j as usize].0.clone();
            let view = b
                .as_strided(&us(&v["sizes"]), &us(&v["strides"]), u(&v["offset"]))
                .map_err(|e| format!("build: {e}"))?;
            built.push((b, view));
        } else {
            built.push(build(v)?);
        }
    }
    let bases: Vec<Tensor> = built.iter().map(|b| b.0.clone()).collect();
    let ins: Vec<Tensor> = built.into_iter().map(|b| b.1).collect();
    let a = &case["args"];
    let op = case["op"].as_str().unwrap();
    let e = |e: tensormem_tensor::TensorError| format!("{e}");
    let one = |t: Tensor| -> Result<Value, String> { Ok(json!({"out": [desc(&t)?]})) };
    let many = |ts: Vec<Tensor>| -> Result<Value, String> {
        Ok(json!({"out": ts.iter().map(|t| desc_view(t, &bases[0])).collect::<Result<Vec<_>, _>>()?}))
    };
    let view = |t: Tensor| -> Result<Value, String> { Ok(json!({"out": [desc_view(&t, &bases[0])?]})) };
    // The in-place and out= forms report every input's base after the op.
    let after =
        || -> Result<Value, String> { Ok(json!({"out": bases.iter().map(desc).collect::<Result<Vec<_>, _>>()?})) };
    macro_rules! bin {
        ($($n:literal => $f:ident, $f_:ident, $fo:ident, $fs:ident, $fs_:ident;)*) => {
            match op {
                $(
                    $n => return one(ins[0].$f(&ins[1]).map_err(e)?),
                    concat!($n, "_") => { ins[0].$f_(&ins[1]).map_err(e)?; return after(); }
                    concat!($n, "_out") => { ins[0].$fo(&ins[1], &ins[2]).map_err(e)?; return after(); }
                    concat!($n, "_scalar") => return one(ins[0].$fs(scalar(&a["s"])).map_err(e)?),
                    concat!($n, "_scalar_") => { ins[0].$fs_(scalar(&a["s"])).map_err(e)?; return after(); }
                )*
                _ => {}
            }
        };
    }
    bin! {
        "add" => add, add_, add_out, add_scalar, add_scalar_;
        "sub" => sub, sub_, sub_out, sub_scalar, sub_scalar_;
        "mul" => mul, mul_, mul_out, mul_scalar, mul_scalar_;
        "div" => div, div_, div_out, div_scalar, div_scalar_;
        "maximum" => maximum, maximum_, maximum_out, maximum_scalar, maximum_scalar_;
        "minimum" => minimum, minimum_, minimum_out, minimum_scalar, minimum_scalar_;
        "pow" => pow, pow_, pow_out, pow_scalar, pow_scalar_;
    }
    macro_rules! cmp {
        ($($n:literal => $f:ident, $fo:ident, $fs:ident;)*) => {
            match op {
                $(
                    $n => return one(ins[0].$f(&ins[1]).map_err(e)?),
                    concat!($n, "_out") => { ins[0].$fo(&ins[1], &ins[2]).map_err(e)?; return after(); }
                    concat!($n, "_scalar") => return one(ins[0].$fs(scalar(&a["s"])).map_err(e)?),
                )*
                _ => {}
            }
        };
    }
    cmp! {
        "eq" => eq, eq_out, eq_scalar;
        "ne" => ne, ne_out, ne_scalar;
        "lt" => lt, lt_out, lt_scalar;
        "le" => le, le_out, le_scalar;
        "gt" => gt, gt_out, gt_scalar;
        "ge" => ge, ge_out, ge_scalar;
    }
    macro_rules! un {
        ($($n:literal => $f:ident, $f_:ident, $fo:ident;)*) => {
            match op {
                $(
                    $n => return one(ins[0].$f().map_err(e)?),
                    concat!($n, "_") => { ins[0].$f_().map_err(e)?; return after(); }
                    concat!($n, "_out") => { ins[0].$fo(&ins[1]).map_err(e)?; return after(); }
                )*
                _ => {}
            }
        };
    }
    un! {
        "neg" => neg, neg_, neg_out;
        "abs" => abs, abs_, abs_out;
        "relu" => relu, relu_, relu_out;
        "exp" => exp, exp_, exp_out;
        "log" => log, log_, log_out;
        "sqrt" => sqrt, sqrt_, sqrt_out;
        "gelu" => gelu, gelu_, gelu_out;
        "gelu_tanh" => gelu_tanh, gelu_tanh_, gelu_tanh_out;
        "sigmoid" => sigmoid, sigmoid_, sigmoid_out;
        "silu" => silu, silu_, silu_out;
        "tanh" => tanh, tanh_, tanh_out;
    }
    if let Some(rest) = op.strip_prefix("alias_") {
        let r = match rest {
            "copy_" => ins[1].copy_(&ins[2]).map(|_| ()),
            "neg_out" => ins[1].neg_out(&ins[2]).map(|_| ()),
            "add_" => ins[1].add_(&ins[2]).map(|_| ()),
            "sub_" => ins[1].sub_(&ins[2]).map(|_| ()),
            "mul_" => ins[1].mul_(&ins[2]).map(|_| ()),
            "div_" => ins[1].div_(&ins[2]).map(|_| ()),
            "add_out" => ins[1].add_out(&ins[2], &ins[3]).map(|_| ()),
            "sub_out" => ins[1].sub_out(&ins[2], &ins[3]).map(|_| ()),
            "mul_out" => ins[1].mul_out(&ins[2], &ins[3]).map(|_| ()),
            "div_out" => ins[1].div_out(&ins[2], &ins[3]).map(|_| ()),
            _ => return Err(format!("unknown op {op}")),
        };
        r.map_err(e)?;
        return Ok(json!({"out": [desc(&bases[0])?]}));
    }
    if let Some(r) = create(op, a) {
        return r;
    }
    if let Some(r) = files(op, a, &ins) {
        return r;
    }
    let x = &ins[0];
    match op {
        "add_scaled" => one(x.add_scaled(&ins[1], a["alpha"].as_f64().unwrap()).map_err(e)?),
        "add_scaled_" => {
            x.add_scaled_(&ins[1], a["alpha"].as_f64().unwrap()).map_err(e)?;
            after()
        }
        "sub_scaled" => one(x.sub_scaled(&ins[1], a["alpha"].as_f64().unwrap()).map_err(e)?),
        "copy_" => {
            x.copy_(&ins[1]).map_err(e)?;
            after()
        }
        "sum" => one(x.sum().map_err(e)?),
        "mean" => one(x.mean().map_err(e)?),
        "max" => one(x.max().map_err(e)?),
        "min" => one(x.min().map_err(e)?),
        "argmax" => one(x.argmax().map_err(e)?),
        "sum_dim" => one(x.sum_dim(i(&a["dim"]), a["keepdim"].as_bool().unwrap()).map_err(e)?),
        "mean_dim" => one(x.mean_dim(i(&a["dim"]), a["keepdim"].as_bool().unwrap()).map_err(e)?),
        "max_dim" => one(x.max_dim(i(&a["dim"]), a["keepdim"].as_bool().unwrap()).map_err(e)?),
        "min_dim" => one(x.min_dim(i(&a["dim"]), a["keepdim"].as_bool().unwrap()).map_err(e)?),
        "argmax_dim" => one(x.argmax_dim(i(&a["dim"]), a["keepdim"].as_bool().unwrap()).map_err(e)?),
        "softmax" => one(x.softmax(i(&a["dim"])).map_err(e)?),
        "log_softmax" => one(x.log_softmax(i(&a["dim"])).map_err(e)?),
        "layer_norm" => {
            one(x.layer_norm(&us(&a["shape"]), ins.get(1), ins.get(2), a["eps"].as_f64().unwrap()).map_err(e)?)
        }
        "rms_norm" => one(x.rms_norm(&us(&a["shape"]), ins.get(1), a["eps"].as_f64()).map_err(e)?),
        "matmul" => one(x.matmul(&ins[1]).map_err(e)?),
        "cat" => one(Tensor::cat(&ins.iter().collect::<Vec<_>>(), i(&a["dim"])).map_err(e)?),
        "stack" => one(Tensor::stack(&ins.iter().collect::<Vec<_>>(), i(&a["dim"])).map_err(e)?),
        "index_select" => one(x.index_select(i(&a["dim"]), &ins[1]).map_err(e)?),
        "gather" => one(x.gather(i(&a["dim"]), &ins[1]).map_err(e)?),
        "embedding" => one(x.embedding(&ins[1]).map_err(e)?),
        "where" => one(x.where_cond(&ins[1], &ins[2]).map_err(e)?),
        "masked_fill" => one(x.masked_fill(&ins[1], scalar(&a["s"])).map_err(e)?),
        "masked_fill_" => {
            x.masked_fill_(&ins[1], scalar(&a["s"])).map_err(e)?;
            after()
        }
        "chunk" => many(x.chunk(u(&a["n"]), i(&a["dim"])).map_err(e)?),
        "split" => many(x.split(u(&a["n"]), i(&a["dim"])).map_err(e)?),
        "narrow" => view(x.narrow(i(&a["dim"]), i(&a["start"]), u(&a["len"])).map_err(e)?),
        "slice" => view(x.slice(i(&a["dim"]), i(&a["start"]), i(&a["end"]), u(&a["step"])).map_err(e)?),
        "select" => view(x.select(i(&a["dim"]), i(&a["index"])).map_err(e)?),
        "transpose" => view(x.transpose(i(&a["d0"]), i(&a["d1"])).map_err(e)?),
        "permute" => view(x.permute(&is(&a["dims"])).map_err(e)?),
        "movedim" => view(x.movedim(i(&a["src"]), i(&a["dst"])).map_err(e)?),
        "reshape" => view(x.reshape(&is(&a["sizes"])).map_err(e)?),
        "view" => view(x.view(&is(&a["sizes"])).map_err(e)?),
        "squeeze" => view(x.squeeze().map_err(e)?),
        "squeeze_dim" => view(x.squeeze_dim(i(&a["dim"])).map_err(e)?),
        "unsqueeze" => view(x.unsqueeze(i(&a["dim"])).map_err(e)?),
        "expand" => view(x.expand(&is(&a["sizes"])).map_err(e)?),
        "broadcast_to" => view(x.broadcast_to(&us(&a["sizes"])).map_err(e)?),
        "flatten" => view(x.flatten().map_err(e)?),
        "t" => view(x.t().map_err(e)?),
        "contiguous" => view(x.contiguous().map_err(e)?),
        "zeros_like" => one(Tensor::zeros_like(x).map_err(e)?),
        "full_like" => one(Tensor::full_like(x, 2.0).map_err(e)?),
        "to_dtype" => one(x.to_dtype(dtype(a["dtype"].as_str().unwrap())).map_err(e)?),
        "size" => Ok(json!({"size": x.size(i(&a["dim"])).map_err(e)?})),
        "display" => Ok(json!({"text": format!("{x}")})),
        _ => Err(format!("unknown op {op}")),
    }
}

/// The creation ops, which take no input tensor.
fn create(op: &str, a: &Value) -> Option<Result<Value, String>> {
    // "v" comes as a string, for the non-finite values.
    let f = |k: &str| a[k].as_f64().unwrap_or_else(|| a[k].as_str().unwrap().parse().unwrap());
    let dt = || dtype(a["dtype"].as_str().unwrap());
    let t = match op {
        "arange" => Tensor::arange(f("start"), f("end"), f("step"), dt()),
        "full" => Tensor::full(&us(&a["sizes"]), f("v"), dt()),
        "zeros" => Tensor::zeros(&us(&a["sizes"]), dt()),
        "ones" => Tensor::ones(&us(&a["sizes"]), dt()),
        "scalar" => Tensor::scalar(f("v"), dt()),
        _ => return None,
    };
    Some(t.map_err(|e| format!("{e}")).and_then(|t| Ok(json!({"out": [desc(&t)?]}))))
}

/// The safetensors ops: `st_save` writes the inputs under `names` (the reference reads the file
/// back); `st_load` reads the reference's file through a mapping, `st_load_copy` into memory.
fn files(op: &str, a: &Value, ins: &[Tensor]) -> Option<Result<Value, String>> {
    let e = |e: tensormem_tensor::TensorError| format!("{e}");
    let names: Vec<&str> = a["names"].as_array()?.iter().map(|n| n.as_str().unwrap()).collect();
    let path = a["path"].as_str()?;
    let r = match op {
        "st_save" => {
            let list: Vec<(&str, &Tensor)> = names.iter().copied().zip(ins).collect();
            save_safetensors(path, &list, None).map_err(e).and_then(|()| ins.iter().map(desc).collect())
        }
        "st_load" => (|| {
            // SAFETY: nothing else writes the file while it is open.
            let file = unsafe { SafeTensors::open(path) }.map_err(e)?;
            names
                .iter()
                .map(|n| {
                    let t = file.tensor(n).map_err(e)?;
                    // The checked form agrees with what the plain one found.
                    file.tensor_checked(n, t.dtype(), t.sizes()).map_err(e)?;
                    desc(&t)
                })
                .collect()
        })(),
        "st_load_copy" => {
            names.iter().map(|n| desc(&Tensor::load_safetensors(path, n, TensorOptions::new()).map_err(e)?)).collect()
        }
        _ => return None,
    };
    Some(r.map(|outs: Vec<Value>| json!({ "out": outs })))
}

fn main() {
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let case: Value = serde_json::from_str(&line.unwrap()).unwrap();
        let id = case["id"].clone();
        let r = std::panic::catch_unwind(|| run(&case));
        let v = match r {
            Ok(Ok(v)) => json!({"id": id, "ok": true, "r": v}),
            Ok(Err(s)) => json!({"id": id, "ok": false, "err": s}),
            Err(_) => json!({"id": id, "ok": false, "panic": true, "err": "PANIC"}),
        };
        writeln!(out, "{v}").unwrap();
        out.flush().unwrap();
    }
}

"""Differential testing of tensormem's tensors against PyTorch.

Generates random cases (shapes, strided and overlapping layouts, every dtype, special
values), runs each through tensormem (the `torchdiff` example, JSON lines on stdin/stdout)
and through PyTorch, and prints every case where the two differ: a value, a dtype, a
shape, or one refusing what the other accepts. Differences that are intended are
counted apart (KNOWN below, each with its reason).

    cargo build --release -p tensormem-tensor --example torchdiff
    python3 -m venv /tmp/tv && /tmp/tv/bin/pip install torch safetensors
    /tmp/tv/bin/python tensor/tools/torchdiff.py --seed 1 --cases 5000 [--ops add,slice] [--kinds big,alias]
"""
import argparse, atexit, itertools, json, math, os, random, re, shutil, subprocess, sys, tempfile, warnings
import safetensors.torch
import torch

warnings.filterwarnings("ignore")  # PyTorch's deprecation notes on resized out= tensors

torch.set_num_threads(1)
import torch._tensor_str as _ts

# PyTorch decides where `dtype=` goes by its own names' length (torch.float16); tensormem
# prints its own (f16): compare with PyTorch's rule applied to tensormem's names.
_orig_add = _ts._add_suffixes


def _ours(tensor_str, suffixes, indent, force_newline):
    for k, v in TD.items():
        suffixes = [x.replace("dtype=" + str(v), "dtype=" + k) for x in suffixes]
    return _orig_add(tensor_str, suffixes, indent, force_newline)


_ts._add_suffixes = _ours
ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--cases", type=int, default=2000)
ap.add_argument("--ops", help="only ops whose name starts with one of these (comma-separated)")
ap.add_argument("--kinds", help="only these generators (comma-separated, e.g. big,alias,display)")
ap.add_argument("--dump", type=int, help="print case N as JSON (to replay it alone; -1: every case) and stop")
ap.add_argument("--bin", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "target", "release", "examples", "torchdiff"))
ARGS = ap.parse_args()
R = random.Random(ARGS.seed)
N = ARGS.cases
OPS = ARGS.ops.split(",") if ARGS.ops else None
KINDS = ARGS.kinds.split(",") if ARGS.kinds else None
BIN = ARGS.bin

# Differences on purpose: (pattern on the case line + difference, reason).
KNOWN = [
    (r"torch refused \(.*(same dtype|expected scalar type|addmv input tensors|dot : expected|mixed dtype|.bmm. not implemented for 'Bool')", "tensormem promotes mixed dtypes in matmul and the norms' parameters; PyTorch refuses them (a bool operand beside another dtype: a batched product refuses the bool first; tensormem refuses bool @ bool)"),
    (r"torch refused \(.*Found dtype .* but expected", "PyTorch's abs/neg out= need the exact dtype; tensormem casts as other out= forms do"),
    (r"torch refused \(.*alpha must not be a floating point", "add_scaled takes alpha as f64; an integral alpha is taken on integer tensors"),
    (r"torch refused \(.*(Subtraction, the `-` operator, with a bool|Boolean inputs not supported|abs_cpu\" not implemented for 'Bool'|GeluKernelImpl|silu_cpu\" not implemented)", "tensormem computes these (bool-int subtraction, relu/abs of bool, gelu and silu of integers and bools in f32) where PyTorch refuses"),
    (r"torch refused \(.*(index_select\(\): Expected dtype int|gather\(\): Expected dtype int|scalar types: Long, Int)", "any integer dtype indexes"),
    (r"we refused \(pow(_scalar)?_?: not supported for dtype bool", "pow of bool tensors is refused, as sub and neg are"),
    (r"torch refused \(.*some elements of the input tensor and the written-to tensor refer to a single memory location", "PyTorch calls same-element views with different strides on size-1 dimensions a partial overlap"),
    (r"we refused \(.*the output must have the broadcast shape .*it is not resized", "out= tensors are not resized (PyTorch resizes, with a deprecation warning for non-empty ones)"),
    (r"we refused \(where_cond: not supported for dtype u8", "a u8 condition is deprecated in PyTorch; tensormem takes bool only"),
    (r"(softmax|gather|matmul) .*inputs .*\b(bool|u8|i8|i16|i32|i64|f16|bf16|f32|f64)\[(\d+, )*0[\],].*we refused \(.*(softmax|gather|matmul): not supported for dtype", "PyTorch skips its dtype checks for empty tensors"),
    (r"matmul .*out 0: dtype .* vs .*", "PyTorch's matmul of empty tensors with mixed dtypes returns one operand's dtype"),
    (r"(to_dtype|copy_) .*value \[\d+\] \S+ vs -(9.22\d*e\+18|2147483648.0)", "an infinity or NaN into i32/i64 saturates (NaN is 0); PyTorch's result is undefined (x86 gives the minimum)"),
    (r"layer_norm .*value \[\d+\] (\S*inf|nan) vs", "layer_norm of a row or weight holding an infinity: both results are meaningless"),
    (r"^--- case \d+ (full|scalar) .*\"sizes\": \[[1, ]*\].*we refused \((full|scalar): .*fill value does not fit", "PyTorch's fill of a one-element tensor skips its overflow check (70000.0 into f16 is inf there, an error for two elements)"),
    (r"^--- case \d+ arange .*\"(bf16|f16)\".*value \[[1-9][0-9]{7,}\]", "PyTorch's half-precision arange gets elements past index 2^24 wrong (the last of arange(0, 16777221) in bf16 reads 0 or 360448)"),
    (r"^--- case \d+ gelu_?(_out)? .*value \[\d+\] inf vs nan", "gelu(+inf): PyTorch's vectorised f32/f16/bf16 loop gives NaN, its scalar and f64 loops inf, as tensormem does"),
    (r"^--- case \d+ matmul .*\bbf16\[.*value \[\d+\] \S+ vs nan", "bf16 matmul of operands holding infinities: PyTorch's bf16 gemm returns NaN for elements whose exact result is an infinity, or finite (a finite row and column, seen once)"),
    (r"torch refused \(RuntimeError: (numel: integer multiplication overflow|Stride calculation overflowed|as_strided: Negative strides|Trying to create tensor with negative dimension|Storage size calculation overflowed|invalid shape dimension -|split expects split_size be non-negative|.*SymIntArrayRef expected to contain only concrete integers)", "PyTorch refuses empty tensors whose nonzero sizes multiply, or whose strides grow, past int64 (or wraps into negative sizes and strides); tensormem holds empty tensors of any shape"),
    (r"^--- case \d+ slice .*\"end\": -9223372036854775808.*out 0: sizes \[0", "a slice end of -2^63 on a dimension of 2^63 - 1: the end is -1 from the end's side, so the slice is empty (Python's rule); PyTorch's index arithmetic overflows and returns 2^62 - 1 elements"),
    (r"^--- case \d+ slice .*\"start\": -9223372036854775808", "a slice start of -2^63: Python's slicing clamps it to 0 (as tensormem does); PyTorch returns an empty view"),
    (r"^--- case \d+ slice .*\"step\": (1099511627776|9223372036854775807)\}.*out 0: sizes", "a slice step near 2^63: PyTorch's size arithmetic overflows int64 (negative or wrong sizes); tensormem's is exact"),
    (r"we refused \((select|narrow|chunk|slice): shape .* needs more bytes than fit in memory", "an empty view starting more than isize::MAX bytes into its storage is refused; PyTorch keeps the offset"),
    (r"we refused \((split|chunk): cutting an empty tensor .* views of nothing", "splitting an empty tensor into more than 65536 views is refused (issue 11: chunk built 2^32 views); PyTorch builds them"),
    (r"^--- case \d+ div_?(_out)? .*inputs (f16|bf16)\[[^;]*; (u8|i8|i16|i32|i64)\[[1, ]*\].*value \[\d+\] nan vs -?inf", "f16/bf16 divided by a one-element integer tensor: PyTorch takes that divisor in f32 from the integer (-inf / 2147483647 is -inf); tensormem casts it to the common dtype first, as PyTorch does for every longer divisor (f16(2147483647) is inf, and -inf / inf NaN)"),
    (r"^--- case \d+ (slice|unsqueeze) .*inputs \w+\[([^\]]*, )?0(, [^\]]*)?\] .*out 0: strides .* vs ", "a view's stride that is a product past 2^64 (slice's stride * step, unsqueeze's size * stride), only in an empty view: PyTorch's wraps; tensormem keeps the stride (slice, as for a single step) or saturates it (unsqueeze, as contiguous strides)"),
    (r"pow_scalar_? .*\"v\": (0.5|2.0|-1.0|-2.0|3.0|-0.5)\b.*value \[\d+\] \S+ vs ", "pow with these exponents: PyTorch takes sqrt/x*x/1/x shortcuts, which differ from powf at -inf and -0"),
]

TD = {"bool": torch.bool, "u8": torch.uint8, "i8": torch.int8, "i16": torch.int16, "i32": torch.int32,
      "i64": torch.int64, "f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64}
NAME = {v: k for k, v in TD.items()}
ELEM = {k: v.itemsize for k, v in TD.items()}
FLOATS = ["f16", "bf16", "f32", "f64"]
INTS = ["u8", "i8", "i16", "i32", "i64"]
ALL = ["bool"] + INTS + FLOATS


def rval(dt):
    if dt == "bool":
        return float(R.random() < 0.5)
    if dt == "u8":
        return float(R.randint(0, 255) if R.random() < 0.2 else R.randint(0, 9))
    if dt in INTS:
        if R.random() < 0.1:
            return float({"i8": R.choice([-128, 127]), "i16": R.choice([-32768, 32767]), "i32": R.choice([-2**31, 2**31 - 1]), "i64": R.choice([-2**40, 2**40])}[dt])
        return float(R.randint(-9, 9))
    r = R.random()
    if r < 0.04:
        return R.choice([float("inf"), float("-inf"), 0.0, -0.0, float("nan")])
    if r < 0.5:
        return float(R.randint(-8, 8)) / R.choice([1, 2, 4, 8])
    if r < 0.6:  # full precision: conversions to halves land near their ties
        return R.uniform(-4, 4)
    return round(R.uniform(-4, 4), 3)


def layout(sizes, allow_overlap=True):
    """Random strides/offset for a view of `sizes`: returns (strides, offset, base_len)."""
    n = len(sizes)
    kind = R.random()
    if kind < 0.4 or n == 0:
        st = [0] * n
        acc = 1
        for d in reversed(range(n)):
            st[d] = acc
            acc *= max(sizes[d], 1)
    elif kind < 0.7:  # permuted contiguous
        order = list(range(n))
        R.shuffle(order)
        st = [0] * n
        acc = 1
        for d in order:
            st[d] = acc
            acc *= max(sizes[d], 1)
    else:  # gaps and maybe broadcast
        st = [0] * n
        acc = 1
        for d in reversed(range(n)):
            gap = R.choice([1, 1, 2, 3])
            st[d] = acc * gap if R.random() < 0.5 else acc
            acc = st[d] * max(sizes[d], 1) + R.choice([0, 1])
            if allow_overlap and sizes[d] > 1 and R.random() < 0.15:
                st[d] = 0
    off = R.choice([0, 0, 1, 3])
    ext = off + (sum((s - 1) * t for s, t in zip(sizes, st)) + 1 if all(s > 0 for s in sizes) else 0)
    return st, off, max(ext, off)


def rshape(ndim=None, maxs=5):
    if ndim is None:
        # Now and then more dimensions than tensormem keeps inline (6), with smaller sizes.
        ndim = R.choice([0, 1, 1, 2, 2, 3, 4] * 3 + [5, 6, 7, 8])
    if ndim > 4:
        maxs = min(maxs, 3)
    return [R.choice([0, 1] + list(range(2, maxs + 1)) * 3) if R.random() < 0.9 else 1 for _ in range(ndim)]


def tensor_spec(sizes, dt, allow_overlap=True, vals=None):
    st, off, ext = layout(sizes, allow_overlap)
    n = ext + R.choice([0, 2])
    base = [rval(dt) for _ in range(n)] if vals is None else [vals(i) for i in range(n)]
    return {"dtype": dt, "base": base, "sizes": sizes, "strides": st, "offset": off}


def torch_in(spec):
    base = torch.tensor(spec["base"], dtype=torch.float64).to(TD[spec["dtype"]])
    return base, torch.as_strided(base, spec["sizes"], spec["strides"], spec["offset"])


def bshape(s):
    """A shape broadcastable with s."""
    out = [x if R.random() < 0.7 else 1 for x in s]
    k = R.randint(0, len(out))
    out = out[k:]
    if R.random() < 0.1:
        out = [R.choice([1, 2])] + out
    return out


def scal(kinds=("bool", "int", "float")):
    k = R.choice(kinds)
    v = {"bool": lambda: R.random() < 0.5, "int": lambda: R.randint(-5, 5), "float": lambda: R.choice([0.5, -1.25, 2.0, 0.125, 3.7])}[k]()
    return {"kind": k, "v": v}


def pyscal(s):
    return s["v"]


BINOPS = ["add", "sub", "mul", "div", "maximum", "minimum", "pow"]
CMPS = ["eq", "ne", "lt", "le", "gt", "ge"]
UNOPS = ["neg", "abs", "relu", "exp", "log", "sqrt", "gelu", "gelu_tanh", "sigmoid", "silu", "tanh"]
TUN = {"neg": torch.neg, "abs": torch.abs, "relu": torch.relu, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
       "gelu": torch.nn.functional.gelu, "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
       "sigmoid": torch.sigmoid, "silu": torch.nn.functional.silu, "tanh": torch.tanh}
# Functions torch has only in torch.nn.functional: no `x.f_()` and no `out=`.
FUNCTIONAL = ("gelu", "gelu_tanh", "silu")


def gen():
    kinds = ["big"] * 2 + ["alias"] * 3 + ["bin", "bin_", "bin_out", "bin_s", "bin_s_", "cmp", "cmp_out", "cmp_s", "un", "un_", "un_out", "red", "red_dim",
             "softmax", "norm", "matmul", "cat", "stack", "index", "where", "mask", "views", "views", "display", "copy", "to", "scaled", "create", "safetensors"]
    k = R.choice(KINDS or kinds)
    dts = FLOATS if R.random() < 0.5 else ALL
    if k == "big":
        nd = R.choice([1, 2, 2, 3])
        total = R.choice([5000, 40000, 200000])
        sizes = []
        rem = total
        for j in range(nd):
            x = max(1, int(round(rem ** (1 / (nd - j)) * R.uniform(0.5, 1.5)))) if j < nd - 1 else max(1, rem)
            sizes.append(x)
            rem = max(1, rem // x)
        d = R.choice(FLOATS + ["i32", "i64", "u8"])
        op = R.choice(["add", "mul_", "add_out", "sum", "sum_dim", "mean_dim", "max_dim", "argmax", "argmax_dim", "softmax", "log_softmax", "layer_norm", "rms_norm", "cat", "contiguous", "to_dtype", "where", "index_select", "masked_fill_", "gelu", "exp_", "matmul"])
        x = tensor_spec(sizes, d, False)
        ndim = len(sizes)
        dim = R.randint(-ndim, ndim - 1)
        if op in ("add", "mul_", "add_out"):
            y = tensor_spec(bshape(sizes) if op != "add_out" else sizes, R.choice([d, d, "f32"]), True)
            ins = [x, y]
            if op == "add_out":
                ins.append(tensor_spec(sizes, R.choice([d, "f32", "f64"]), False))
            return {"op": op, "inputs": ins, "args": {}}
        if op in ("sum_dim", "mean_dim", "max_dim", "argmax_dim"):
            return {"op": op, "inputs": [x], "args": {"dim": dim, "keepdim": R.random() < 0.5}}
        if op in ("softmax", "log_softmax"):
            x["dtype"] = R.choice(FLOATS)
            return {"op": op, "inputs": [x], "args": {"dim": dim}}
        if op in ("layer_norm", "rms_norm"):
            x["dtype"] = R.choice(FLOATS)
            ns = sizes[R.randint(0, ndim - 1):]
            ins = [x, tensor_spec(ns, x["dtype"])]
            if op == "layer_norm":
                ins.append(tensor_spec(ns, x["dtype"]))
            return {"op": op, "inputs": ins, "args": {"shape": ns, "eps": 1e-5}}
        if op == "cat":
            s2 = list(sizes)
            s2[dim] = R.randint(0, 50)
            return {"op": "cat", "inputs": [x, tensor_spec(s2, R.choice([d, "f32"]))], "args": {"dim": dim}}
        if op == "to_dtype":
            return {"op": op, "inputs": [x], "args": {"dtype": R.choice(ALL)}}
        if op == "where":
            return {"op": op, "inputs": [x, tensor_spec(bshape(sizes), "bool"), tensor_spec(bshape(sizes), R.choice([d, "f32"]))], "args": {}}
        if op == "index_select":
            n = sizes[dim]
            return {"op": op, "inputs": [x, tensor_spec([R.randint(0, 300)], "i64", vals=lambda i: float(R.randint(0, n - 1)))], "args": {"dim": dim}}
        if op == "masked_fill_":
            return {"op": op, "inputs": [x, tensor_spec(bshape(sizes), "bool")], "args": {"s": scal()}}
        if op in ("gelu", "exp_"):
            x["dtype"] = R.choice(FLOATS)
            return {"op": op, "inputs": [x], "args": {}}
        if op == "matmul":
            m, kk, n = R.randint(1, 130), R.randint(1, 130), R.randint(1, 130)
            dd = R.choice(FLOATS)
            return {"op": op, "inputs": [tensor_spec([m, kk], dd, False), tensor_spec([kk, n], dd, False)], "args": {}}
        return {"op": op, "inputs": [x], "args": {}}
    if k == "alias":
        # an in-place or out= op whose operands are views of one storage
        n = R.randint(4, 24)
        dt = R.choice(FLOATS + ["i32", "i64"])
        base = tensor_spec([n], dt, vals=None)
        base["strides"], base["offset"], base["sizes"] = [1], 0, [n]
        def view():
            nd = R.choice([1, 1, 2])
            sizes = [R.randint(0, 4) for _ in range(nd)]
            st = [R.choice([1, 2, 3, 4, 5]) for _ in range(nd)]
            ext = sum((a - 1) * b for a, b in zip(sizes, st)) + 1 if all(sizes) else 0
            if ext > n:
                sizes = [1] * nd
                ext = 1
            off = R.randint(0, n - max(ext, 1)) if n - max(ext, 1) > 0 else 0
            return sizes, st, off
        s0, st0, o0 = view()
        s1, st1, o1 = view()
        if R.random() < 0.5:
            s1, st1 = list(s0), list(st0)
            ext = sum((a - 1) * b for a, b in zip(s1, st1)) + 1 if all(s1) else 0
            o1 = R.randint(0, max(n - max(ext, 1), 0))
        form = R.choice(["inplace", "out", "unary_out", "copy"])
        op = R.choice(BINOPS[:4])
        ins = [base, {"alias": 0, "sizes": s0, "strides": st0, "offset": o0, "dtype": dt, "base": []},
               {"alias": 0, "sizes": s1, "strides": st1, "offset": o1, "dtype": dt, "base": []}]
        if form == "inplace":
            return {"op": "alias_" + op + "_", "inputs": ins, "args": {}}
        if form == "copy":
            return {"op": "alias_copy_", "inputs": ins, "args": {}}
        if form == "unary_out":
            ins[2]["sizes"] = list(s0)
            ins[2]["strides"] = list(st0) if R.random() < 0.5 else ins[2]["strides"][:len(s0)] + [1] * (len(s0) - len(ins[2]["strides"]))
            ext = sum((a - 1) * b for a, b in zip(s0, ins[2]["strides"])) + 1 if all(s0) else 0
            if ext > n:
                ins[2]["strides"] = list(st0)
                ext = sum((a - 1) * b for a, b in zip(s0, st0)) + 1 if all(s0) else 0
            ins[2]["offset"] = R.randint(0, max(n - max(ext, 1), 0))
            return {"op": "alias_neg_out", "inputs": ins, "args": {}}
        s2, st2, o2 = view()
        try:
            s2 = list(torch.broadcast_shapes(tuple(s0), tuple(s1)))
            if len(s2) != len(st2):
                st2 = [R.choice([1, 2, 3]) for _ in s2]
            ext = sum((a - 1) * b for a, b in zip(s2, st2)) + 1 if all(s2) else 0
            if ext > n:
                st2 = [0] * len(s2)
                acc = 1
                for d in reversed(range(len(s2))):
                    st2[d] = acc
                    acc *= max(s2[d], 1)
                ext = sum((a - 1) * b for a, b in zip(s2, st2)) + 1 if all(s2) else 0
            o2 = R.randint(0, max(n - max(ext, 1), 0)) if ext <= n else 0
        except RuntimeError:
            pass
        ins.append({"alias": 0, "sizes": s2, "strides": st2, "offset": o2, "dtype": dt, "base": []})
        return {"op": "alias_" + op + "_out", "inputs": ins, "args": {}}
    if k.startswith("bin") or k.startswith("cmp"):
        ops = BINOPS if k.startswith("bin") else CMPS
        op = R.choice(ops)
        s0 = rshape()
        s1 = bshape(s0)
        d0, d1 = R.choice(dts), R.choice(dts)
        if k in ("bin", "cmp"):
            return {"op": op, "inputs": [tensor_spec(s0, d0), tensor_spec(s1, d1)], "args": {}}
        if k == "bin_":
            # overlapping sibling views of one base sometimes
            return {"op": op + "_", "inputs": [tensor_spec(s0, d0), tensor_spec(s1, d1)], "args": {}}
        if k in ("bin_out", "cmp_out"):
            try:
                so = list(torch.broadcast_shapes(tuple(s0), tuple(s1))) if R.random() < 0.9 else rshape()
            except RuntimeError:
                so = rshape()
            do = R.choice(ALL) if k == "bin_out" else ("bool" if R.random() < 0.8 else R.choice(ALL))
            return {"op": op + "_out", "inputs": [tensor_spec(s0, d0), tensor_spec(s1, d1), tensor_spec(so, do, False)], "args": {}}
        if k in ("bin_s", "cmp_s"):
            return {"op": op + "_scalar", "inputs": [tensor_spec(s0, d0)], "args": {"s": scal()}}
        return {"op": op + "_scalar_", "inputs": [tensor_spec(s0, d0)], "args": {"s": scal()}}
    if k.startswith("un"):
        op = R.choice(UNOPS)
        s0 = rshape()
        d0 = R.choice(dts)
        if k == "un":
            return {"op": op, "inputs": [tensor_spec(s0, d0)], "args": {}}
        if k == "un_":
            return {"op": op + "_", "inputs": [tensor_spec(s0, d0)], "args": {}}
        return {"op": op + "_out", "inputs": [tensor_spec(s0, d0), tensor_spec(s0 if R.random() < 0.9 else rshape(), R.choice(ALL), False)], "args": {}}
    if k == "scaled":
        s0 = rshape()
        op = R.choice(["add_scaled", "add_scaled_", "sub_scaled"])
        return {"op": op, "inputs": [tensor_spec(s0, R.choice(dts)), tensor_spec(bshape(s0), R.choice(dts))],
                "args": {"alpha": R.choice([1.0, 2.0, -1.0, 0.5, 3.0])}}
    if k == "red":
        return {"op": R.choice(["sum", "mean", "max", "min", "argmax"]), "inputs": [tensor_spec(rshape(), R.choice(dts))], "args": {}}
    if k == "red_dim":
        s0 = rshape()
        nd = max(len(s0), 1)
        return {"op": R.choice(["sum_dim", "mean_dim", "max_dim", "min_dim", "argmax_dim"]), "inputs": [tensor_spec(s0, R.choice(dts))],
                "args": {"dim": R.randint(-nd - 1, nd), "keepdim": R.random() < 0.5}}
    if k == "softmax":
        s0 = rshape()
        nd = max(len(s0), 1)
        return {"op": R.choice(["softmax", "log_softmax"]), "inputs": [tensor_spec(s0, R.choice(dts))], "args": {"dim": R.randint(-nd, nd - 1)}}
    if k == "norm":
        s0 = rshape(R.choice([1, 2, 3]))
        j = R.randint(0, len(s0))
        ns = s0[j:] if R.random() < 0.9 else rshape(1)
        d = R.choice(FLOATS if R.random() < 0.9 else ALL)
        op = R.choice(["layer_norm", "rms_norm"])
        ins = [tensor_spec(s0, d)]
        if R.random() < 0.6:
            ins.append(tensor_spec(ns, R.choice([d, d, "f32"])))
            if op == "layer_norm" and R.random() < 0.6:
                ins.append(tensor_spec(ns, R.choice([d, d, "f32"])))
        return {"op": op, "inputs": ins, "args": {"shape": ns, "eps": R.choice([1e-5, 1e-6, 0.1])}}
    if k == "matmul":
        m, kk, n = R.randint(0, 5), R.randint(0, 5), R.randint(0, 5)
        if R.random() < 0.2:  # sizes that bf16 and f16 products take to AMX tiles (at least 16x32x16)
            m, kk, n = R.randint(16, 70), R.randint(32, 160), R.randint(16, 70)
        form = R.random()
        if form < 0.2:
            sa, sb = [kk], [kk]
        elif form < 0.35:
            sa, sb = [kk], [kk, n]
        elif form < 0.5:
            sa, sb = [m, kk], [kk]
        elif form < 0.75:
            sa, sb = [m, kk], [kk, n]
        else:
            batch = rshape(R.randint(1, 2), 3)
            sa, sb = bshape(batch) + [m, kk], bshape(batch) + [kk, n]
        if R.random() < 0.1:
            sb = rshape()
        d = R.choice(FLOATS if R.random() < 0.8 else ALL)
        return {"op": "matmul", "inputs": [tensor_spec(sa, d), tensor_spec(sb, R.choice([d, d, d, R.choice(ALL)]))], "args": {}}
    if k in ("cat", "stack"):
        s0 = rshape(R.randint(1, 3))
        nd = len(s0)
        dim = R.randint(-nd - (1 if k == "stack" else 0), nd - (0 if k == "stack" else 1))
        ins = []
        for _ in range(R.randint(1, 4)):
            s = list(s0)
            if k == "cat" and R.random() < 0.7:
                s[dim] = R.randint(0, 4)
            if R.random() < 0.05:
                s = rshape()
            ins.append(tensor_spec(s, R.choice(dts)))
        return {"op": k, "inputs": ins, "args": {"dim": dim}}
    if k == "index":
        op = R.choice(["index_select", "gather", "embedding"])
        s0 = rshape(R.randint(1, 3))
        nd = len(s0)
        dim = R.randint(-nd, nd - 1)
        size = s0[dim]
        idt = R.choice(["i64", "i64", "i32", R.choice(ALL)])
        hi = size - 1 if R.random() < 0.95 else size
        iv = lambda i: float(R.randint(-size if R.random() < 0.1 else 0, max(hi, 0)))
        if op == "index_select":
            isz = [R.randint(0, 6)] if R.random() < 0.9 else rshape()
        elif op == "gather":
            isz = [R.randint(0, x) for x in s0]
            isz[dim] = R.randint(0, 5)
        else:
            s0 = rshape(2)
            size = s0[0]
            hi = size - 1 if R.random() < 0.95 else size
            iv = lambda i: float(R.randint(0, max(hi, 0)))
            isz = rshape(R.randint(0, 2))
        ins = [tensor_spec(s0, R.choice(dts)), tensor_spec(isz, idt, vals=iv)]
        return {"op": op, "inputs": ins, "args": {"dim": dim}}
    if k == "where":
        s0 = rshape()
        return {"op": "where", "inputs": [tensor_spec(bshape(s0), R.choice(dts)), tensor_spec(s0, "bool" if R.random() < 0.9 else R.choice(ALL)),
                                          tensor_spec(bshape(s0), R.choice(dts))], "args": {}}
    if k == "mask":
        s0 = rshape()
        op = R.choice(["masked_fill", "masked_fill_"])
        return {"op": op, "inputs": [tensor_spec(s0, R.choice(dts), op == "masked_fill"), tensor_spec(bshape(s0), "bool" if R.random() < 0.9 else R.choice(ALL))],
                "args": {"s": scal()}}
    if k == "copy":
        s0 = rshape()
        return {"op": "copy_", "inputs": [tensor_spec(s0, R.choice(dts), False), tensor_spec(bshape(s0), R.choice(dts))], "args": {}}
    if k == "to":
        return {"op": "to_dtype", "inputs": [tensor_spec(rshape(), R.choice(ALL))], "args": {"dtype": R.choice(ALL)}}
    if k == "huge":
        # empty tensors with huge dimensions, and extreme arguments: no overflow, no hang
        big = [2**31, 2**32, 2**40, 2**62, 2**63 - 1]
        nd = R.randint(1, 4)
        sizes = [R.choice(big + [0, 1, 2, 3]) for _ in range(nd)]
        if math.prod(sizes) != 0 or R.random() < 0.2:
            sizes[R.randrange(nd)] = 0
        x = {"dtype": R.choice(ALL), "base": [1.0, 2.0], "sizes": sizes, "strides": [R.choice([0, 1, 2]) for _ in sizes], "offset": R.choice([0, 1])}
        if R.random() < 0.3:
            # contiguous strides (products of the sizes, capped at 2^63 - 1), as zeros(sizes) has
            # them: unsqueeze's size * stride overflowed with these
            st, acc = [], 1
            for sz in reversed(sizes):
                st.append(min(acc, 2**63 - 1))
                acc *= max(sz, 1)
            x["strides"] = st[::-1]
        ext = lambda: R.choice(big + [-(2**63), -(2**62), 2**63 - 1, -1, 0, 1, 5])
        rd = lambda: R.randint(-nd, nd - 1)
        op = R.choice(["slice", "narrow", "chunk", "split", "select", "expand", "broadcast_to", "reshape", "view", "flatten", "unsqueeze",
                       "squeeze", "permute", "t", "contiguous", "sum", "sum_dim", "max_dim", "argmax_dim", "softmax", "log_softmax", "add", "neg", "to_dtype",
                       "display", "matmul", "cat", "stack", "index_select", "where", "masked_fill", "layer_norm", "size", "copy_", "mean",
                       "mean_dim", "min_dim", "rms_norm", "gather", "embedding", "argmax", "movedim", "exp", "mul_", "gelu"])
        args = {}
        ins = [x]
        if op == "slice":
            args = {"dim": rd(), "start": ext(), "end": ext(), "step": R.choice([1, 2, 2**40, 2**63 - 1])}
        elif op == "narrow":
            args = {"dim": rd(), "start": R.choice([0, 1, 2**40, -(2**40), 2**63 - 1]), "len": R.choice([0, 1, 2**40, 2**63 - 1])}
        elif op in ("chunk", "split"):
            # few pieces: PyTorch would build billions of views (tensormem refuses more than it can)
            args = {"n": R.choice([1, 2, 3] if op == "chunk" else [2**40, 2**63 - 1]), "dim": rd()}
        elif op == "select":
            args = {"dim": rd(), "index": ext()}
        elif op in ("expand", "broadcast_to"):
            tgt = [R.choice([s, s, R.choice(big)]) if s == 1 else s for s in sizes]
            if R.random() < 0.5:
                tgt = [R.choice(big + [0, 3])] + tgt
            args = {"sizes": tgt}
        elif op in ("reshape", "view"):
            args = {"sizes": R.choice([[-1], [0, -1], [-1, 0], [0, R.choice(big)], [R.choice(big), 0, R.choice(big)], [2**62, 4, 0]])}
        elif op == "unsqueeze":
            args = {"dim": R.randint(-nd - 1, nd)}
        elif op == "permute":
            p = list(range(nd))
            R.shuffle(p)
            args = {"dims": p}
        elif op in ("sum_dim", "max_dim", "argmax_dim", "mean_dim", "min_dim"):
            # reduce a dimension other than the empty one when one is left: the output stays empty
            zeros = [j for j, z in enumerate(sizes) if z == 0]
            others = [j for j in range(nd) if j != zeros[0]] if len(zeros) == 1 else list(range(nd))
            args = {"dim": R.choice(others or [0]), "keepdim": R.random() < 0.5}
        elif op in ("softmax", "log_softmax"):
            x["dtype"] = R.choice(FLOATS)
            args = {"dim": rd()}
        elif op in ("add", "where", "copy_", "mul_"):
            y = dict(x, sizes=bshape(sizes), strides=None)
            y["strides"] = [R.choice([0, 1]) for _ in y["sizes"]]
            ins = [x, y] if op != "where" else [x, dict(y, dtype="bool"), x]
        elif op == "masked_fill":
            ins = [x, dict(x, dtype="bool")]
            args = {"s": scal()}
        elif op == "to_dtype":
            args = {"dtype": R.choice(ALL)}
        elif op == "matmul":
            if nd >= 2:
                sizes[0] = 0  # an empty product: no huge output of zeros
            y = dict(x, sizes=[sizes[-1], R.choice([0, 2])], strides=[1, 1])
            x["dtype"] = y["dtype"] = R.choice(FLOATS)
            ins = [x, y]
        elif op in ("cat", "stack"):
            ins = [x, dict(x)]
            args = {"dim": rd()}
        elif op == "index_select":
            ins = [x, {"dtype": "i64", "base": [0.0], "sizes": [R.choice([0, 1])], "strides": [1], "offset": 0}]
            args = {"dim": rd()}
        elif op in ("layer_norm", "rms_norm"):
            # the empty dimension among the rows: PyTorch allocates statistics for every row
            x["dtype"] = R.choice(FLOATS)
            sizes[-1] = R.choice([1, 2, 3])
            sizes[0] = 0
            x["strides"] = [1] * nd
            args = {"shape": sizes[-1:], "eps": 1e-5}
        elif op in ("exp", "gelu"):
            x["dtype"] = R.choice(FLOATS)
        elif op == "movedim":
            args = {"src": rd(), "dst": rd()}
        elif op == "gather":
            # an empty index of the input's rank (PyTorch requires the index's other sizes to be
            # at most the input's)
            dim = rd()
            isz = [R.choice([0, min(s, 1)]) for s in sizes]
            isz[R.randrange(nd)] = 0
            ins = [x, {"dtype": "i64", "base": [0.0], "sizes": isz, "strides": [1] * nd, "offset": 0}]
            args = {"dim": dim}
        elif op == "embedding":
            # an empty table with huge rows, or indices of no rows
            x["sizes"] = sizes = [0, R.choice(big + [2])] if R.random() < 0.5 else [R.choice([1, 2]), 0]
            x["strides"] = [R.choice([0, 1]), 1]
            ins = [x, {"dtype": "i64", "base": [0.0], "sizes": [0, R.choice(big + [1])], "strides": [1, 1], "offset": 0}]
        elif op == "size":
            args = {"dim": rd()}
        return {"op": op, "inputs": ins, "args": args}
    if k == "safetensors":
        # Files written by one side and read by the other: tensormem's save_safetensors read by
        # the safetensors package, the package's files read through SafeTensors::open.
        op = R.choice(["st_save", "st_load", "st_load_copy"])
        names = R.sample(ST_NAMES, R.randint(1, 4))
        ins = [tensor_spec(rshape(), R.choice(ALL)) for _ in names]
        path = os.path.join(TMP, f"{next(ST_COUNT)}.safetensors")
        if op != "st_save":
            safetensors.torch.save_file({n: torch_in(sp)[1].contiguous().clone() for n, sp in zip(names, ins)}, path, metadata={"format": "pt"})
        return {"op": op, "inputs": ins, "args": {"path": path, "names": names}}
    if k == "create":
        op = R.choice(["arange", "arange", "arange", "full", "full", "zeros", "ones", "scalar"])
        d = R.choice(ALL)
        num = lambda: R.choice([R.randint(-6, 6), R.randint(-6, 6), round(R.uniform(-6, 6), 2), R.choice([0.1, 0.3, 1e-3, 2.5, -0.7])])
        if op == "arange":
            st = R.choice([1, 1, 2, -1, -2, 0.5, -0.25, 0.1, 3, 0.3, 0])
            a, b = num(), num()
            if R.random() < 0.1:
                a, b = R.choice([(0, 2**24 + 5), (2**24, 2**24 + 9), (250, 260), (-130, -120), (0.0, 1.0), (1, 1e-9)])
                st = math.copysign(max(abs(st), 1), st) if abs(b - a) > 1000 else st  # at most ~2^24 elements
            return {"op": op, "inputs": [], "args": {"start": float(a), "end": float(b), "step": float(st), "dtype": d}}
        v = R.choice([0.0, 1.0, -1.0, 2.5, -2.5, 255.0, 256.0, -129.0, 1e10, 70000.0, float("inf"), float("nan"), 3.4e38, 1e300, 0.1])
        sizes = rshape()
        if op == "scalar":
            sizes = []
        return {"op": op, "inputs": [], "args": {"sizes": sizes, "v": repr(v), "dtype": d}}
    if k == "display":
        d = R.choice(ALL)
        r = R.random()
        if r < 0.4:
            s0 = rshape(R.choice([0, 1, 1, 2, 2, 3]), 4)
        elif r < 0.7:
            s0 = [R.randint(0, 40)]
        elif r < 0.9:
            s0 = [R.randint(1, 12), R.randint(1, 12)]
        else:
            s0 = R.choice([[R.randint(990, 1100)], [R.randint(30, 40), R.randint(30, 40)], [3, R.randint(8, 12), R.randint(30, 40)]])
        scale = R.choice([1, 1, 1e-5, 1e-3, 1e3, 1e5, 1e9, 1e-9])
        mk = R.choice(["plain", "int", "mixed"])
        def vals(i):
            v = rval(d)
            if d in FLOATS:
                if mk == "int":
                    v = float(round(v)) if math.isfinite(v) else v
                v = v * scale
            return v
        return {"op": "display", "inputs": [tensor_spec(s0, d, vals=vals)], "args": {}}
    # views
    s0 = rshape()
    nd = len(s0)
    op = R.choice(["chunk", "split", "narrow", "slice", "select", "transpose", "permute", "movedim", "reshape", "view", "squeeze",
                   "squeeze_dim", "unsqueeze", "expand", "broadcast_to", "flatten", "t", "contiguous", "size", "zeros_like", "full_like"])
    rd = lambda extra=0: R.randint(-nd - extra, max(nd - 1 + extra, 0)) if nd or extra else R.choice([0, -1])
    args = {}
    if op in ("chunk", "split"):
        args = {"n": R.randint(0, 5), "dim": rd()}
    elif op == "narrow":
        args = {"dim": rd(), "start": R.randint(-3, 4), "len": R.randint(0, 4)}
    elif op == "slice":
        args = {"dim": rd(), "start": R.choice([0, 1, -2, -100, 3]), "end": R.choice([0, 2, -1, 100, 5]), "step": R.choice([1, 1, 2, 3, 0])}
    elif op == "select":
        args = {"dim": rd(), "index": R.randint(-4, 4)}
    elif op == "transpose":
        args = {"d0": rd(), "d1": rd()}
    elif op == "permute":
        p = list(range(nd))
        R.shuffle(p)
        if R.random() < 0.3:
            p = [x - nd for x in p]
        if R.random() < 0.1 and p:
            p[0] = p[-1]
        args = {"dims": p}
    elif op == "movedim":
        args = {"src": rd(), "dst": rd()}
    elif op in ("reshape", "view"):
        n = math.prod(s0)
        cands = [[n], [-1], [1, n], [n, 1], [-1, 1]]
        for a in range(1, 6):
            if n % a == 0:
                cands.append([a, -1])
                cands.append([a, n // a])
        if n == 0:
            cands += [[0, -1], [0, 3], [-1, 0]]
        cands.append([n + 1])
        args = {"sizes": R.choice(cands)}
    elif op == "squeeze_dim" or op == "size":
        args = {"dim": rd()}
    elif op == "unsqueeze":
        args = {"dim": rd(1)}
    elif op in ("expand", "broadcast_to"):
        tgt = [R.choice([2, 3]) if x == 1 and R.random() < 0.5 else x for x in s0]
        if R.random() < 0.3:
            tgt = [R.randint(1, 3)] + tgt
        if op == "expand":
            tgt = [-1 if R.random() < 0.3 and j >= len(tgt) - nd else x for j, x in enumerate(tgt)]
        if R.random() < 0.1:
            tgt = rshape()
        args = {"sizes": tgt}
    return {"op": op, "inputs": [tensor_spec(s0, R.choice(ALL))], "args": args}


def t_run(case):
    op, a = case["op"], case["args"]
    bt = []
    for sp in case["inputs"]:
        if "alias" in sp:
            b = bt[sp["alias"]][0]
            bt.append((b, torch.as_strided(b, sp["sizes"], sp["strides"], sp["offset"])))
        else:
            bt.append(torch_in(sp))
    bases = [b for b, _ in bt]
    ins = [v for _, v in bt]
    if op.startswith("alias_"):
        op = op[6:]
        def go(ins):
            if op == "copy_":
                ins[1].copy_(ins[2])
            elif op == "neg_out":
                torch.neg(ins[1], out=ins[2])
            elif op.endswith("_out"):
                getattr(torch, op[:-4])(ins[1], ins[2], out=ins[3])
            else:
                getattr(ins[1], op)(ins[2])
        written = ins[3] if op.endswith("_out") and op != "neg_out" else (ins[2] if op == "neg_out" else ins[1])
        if written.shape and any(st == 0 and sz > 1 for sz, st in zip(written.shape, written.stride())) and written.numel():
            pass  # torch's own error decides
        snapshot = bases[0].clone()
        go(ins)  # raises where torch refuses
        # torch accepted: the reference is the read-before-write result
        bases[0].copy_(snapshot)
        srcs = [ins[0]] + [t.clone() if t is not written else t for t in ins[1:]]
        go(srcs)
        idx = set(torch.as_strided(torch.arange(bases[0].numel()), written.shape, written.stride(), written.storage_offset()).flatten().tolist())
        if len(idx) != written.numel():
            return {"skip": True}
        return {"out": [bases[0]]}
    x = ins[0] if ins else None
    global LAST_BASE
    LAST_BASE = bases[0] if bases else None
    if op == "arange":
        return {"out": [torch.arange(a["start"], a["end"], a["step"], dtype=TD[a["dtype"]])]}
    if op in ("full", "scalar"):
        return {"out": [torch.full(a["sizes"], float(a["v"]), dtype=TD[a["dtype"]])]}
    if op in ("zeros", "ones"):
        return {"out": [getattr(torch, op)(a["sizes"], dtype=TD[a["dtype"]])]}
    if op == "st_save":
        # The package must accept what tensormem wrote, and read back the views' elements.
        safetensors.torch.save_file({n: t.contiguous().clone() for n, t in zip(a["names"], ins)}, a["path"] + ".ref")
        back = safetensors.torch.load_file(a["path"])
        if sorted(back) != sorted(a["names"]):
            raise AssertionError(f"names {sorted(back)} in the file, {sorted(a['names'])} saved")
        return {"out": [back[n] for n in a["names"]]}
    if op.startswith("st_load"):
        return {"out": [t.contiguous() for t in ins]}
    after = lambda: {"out": bases}
    one = lambda t: {"out": [t]}
    for b in BINOPS:
        tf = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "maximum": torch.maximum, "minimum": torch.minimum, "pow": torch.pow}[b]
        if op == b:
            return one(tf(ins[0], ins[1]))
        if op == b + "_":
            if b in ("maximum", "minimum"):
                r = tf(ins[0], ins[1])
                if not torch.can_cast(r.dtype, ins[0].dtype) or r.shape != ins[0].shape:
                    raise RuntimeError("in-place cast/shape")
                hio = torch._debug_has_internal_overlap
                if hio(ins[0]) == 1:
                    raise RuntimeError("overlap")
                ins[0].copy_(r)
                return after()
            getattr(ins[0], b + "_")(ins[1])
            return after()
        if op == b + "_out":
            tf(ins[0], ins[1], out=ins[2])
            return after()
        if op == b + "_scalar":
            if b in ("maximum", "minimum"):
                s = pyscal(a["s"])
                dt = torch.result_type(ins[0], s)
                return one(tf(ins[0].to(dt), torch.tensor(s, dtype=dt)))
            return one(tf(ins[0], pyscal(a["s"])))
        if op == b + "_scalar_":
            if b in ("maximum", "minimum"):
                s = pyscal(a["s"])
                dt = torch.result_type(ins[0], s)
                if not torch.can_cast(dt, ins[0].dtype):
                    raise RuntimeError("in-place cast")
                hio = torch._debug_has_internal_overlap
                if hio(ins[0]) == 1:
                    raise RuntimeError("overlap")
                ins[0].copy_(tf(ins[0].to(dt), torch.tensor(s, dtype=dt)))
                return after()
            getattr(ins[0], b + "_")(pyscal(a["s"]))
            return after()
    for c in CMPS:
        tf = getattr(torch, c)
        if op == c:
            return one(tf(ins[0], ins[1]))
        if op == c + "_out":
            tf(ins[0], ins[1], out=ins[2])
            return after()
        if op == c + "_scalar":
            return one(tf(ins[0], pyscal(a["s"])))
    for u in UNOPS:
        tf = TUN[u]
        if op == u:
            return one(tf(x))
        if op == u + "_":
            if u in FUNCTIONAL:
                tf(x).clone()  # no gelu_ in torch; emulate in-place semantic checks
                if not x.dtype.is_floating_point:
                    raise RuntimeError("gelu int")
                x.copy_(tf(x))
            else:
                getattr(x, u + "_")()
            return after()
        if op == u + "_out":
            if u in FUNCTIONAL:
                r = tf(x)
                if not torch.can_cast(r.dtype, ins[1].dtype):
                    raise RuntimeError("cast")
                if list(ins[1].shape) != list(r.shape):
                    raise RuntimeError("shape")
                ins[1].copy_(r)
            elif u == "relu":
                r = torch.relu(x)
                if not torch.can_cast(r.dtype, ins[1].dtype):
                    raise RuntimeError("cast")
                if list(ins[1].shape) != list(r.shape):
                    raise RuntimeError("shape")
                ins[1].copy_(r)
            else:
                getattr(torch, u)(x, out=ins[1])
            return after()
    if op == "add_scaled":
        return one(torch.add(x, ins[1], alpha=a["alpha"]))
    if op == "add_scaled_":
        x.add_(ins[1], alpha=a["alpha"])
        return after()
    if op == "sub_scaled":
        return one(torch.sub(x, ins[1], alpha=a["alpha"]))
    if op == "copy_":
        x.copy_(ins[1])
        return after()
    if op in ("sum", "mean", "max", "min", "argmax"):
        return one(getattr(torch, op)(x))
    if op in ("sum_dim", "mean_dim", "max_dim", "min_dim", "argmax_dim"):
        f = {"sum_dim": torch.sum, "mean_dim": torch.mean, "max_dim": torch.amax, "min_dim": torch.amin, "argmax_dim": torch.argmax}[op]
        return one(f(x, a["dim"], keepdim=a["keepdim"]))
    if op == "softmax":
        return one(torch.softmax(x, a["dim"]))
    if op == "log_softmax":
        return one(torch.log_softmax(x, a["dim"]))
    if op == "layer_norm":
        return one(torch.nn.functional.layer_norm(x, a["shape"], ins[1] if len(ins) > 1 else None, ins[2] if len(ins) > 2 else None, a["eps"]))
    if op == "rms_norm":
        return one(torch.nn.functional.rms_norm(x, a["shape"], ins[1] if len(ins) > 1 else None, a["eps"]))
    if op == "matmul":
        return one(torch.matmul(x, ins[1]))
    if op == "cat":
        return one(torch.cat(ins, a["dim"]))
    if op == "stack":
        return one(torch.stack(ins, a["dim"]))
    if op == "index_select":
        return one(torch.index_select(x, a["dim"], ins[1]))
    if op == "gather":
        return one(torch.gather(x, a["dim"], ins[1]))
    if op == "embedding":
        return one(torch.nn.functional.embedding(ins[1], x))
    if op == "where":
        return one(torch.where(ins[1], x, ins[2]))
    if op == "masked_fill":
        return one(x.masked_fill(ins[1], pyscal(a["s"])))
    if op == "masked_fill_":
        x.masked_fill_(ins[1], pyscal(a["s"]))
        return after()
    if op == "chunk":
        return {"out": list(torch.chunk(x, a["n"], a["dim"]))}
    if op == "split":
        return {"out": list(torch.split(x, a["n"], a["dim"]))}
    if op == "narrow":
        return one(torch.narrow(x, a["dim"], a["start"], a["len"]))
    if op == "slice":
        if a["step"] <= 0:
            raise RuntimeError("step")
        d = a["dim"]
        idx = [slice(None)] * x.dim()
        idx[d] = slice(a["start"], a["end"], a["step"])
        if x.dim() == 0:
            raise IndexError("0-d")
        return one(x[tuple(idx)])
    if op == "select":
        return one(torch.select(x, a["dim"], a["index"]))
    if op == "transpose":
        return one(torch.transpose(x, a["d0"], a["d1"]))
    if op == "permute":
        return one(x.permute(a["dims"]))
    if op == "movedim":
        return one(torch.movedim(x, a["src"], a["dst"]))
    if op == "reshape":
        return one(x.reshape(a["sizes"]))
    if op == "view":
        return one(x.view(a["sizes"]))
    if op == "squeeze":
        return one(x.squeeze())
    if op == "squeeze_dim":
        return one(x.squeeze(a["dim"]))
    if op == "unsqueeze":
        return one(x.unsqueeze(a["dim"]))
    if op == "expand":
        return one(x.expand(a["sizes"]))
    if op == "broadcast_to":
        return one(torch.broadcast_to(x, a["sizes"]))
    if op == "flatten":
        return one(x.flatten())
    if op == "t":
        return one(x.t())
    if op == "contiguous":
        return one(x.contiguous())
    if op == "zeros_like":
        return one(torch.zeros_like(x))
    if op == "full_like":
        return one(torch.full_like(x, 2))
    if op == "to_dtype":
        return one(x.to(TD[a["dtype"]]))
    if op == "size":
        return {"size": x.size(a["dim"])}
    if op == "display":
        return {"text": repr(x)}
    raise ValueError(op)


LAST_BASE = None
TMP = tempfile.mkdtemp(prefix="torchdiff-")
atexit.register(shutil.rmtree, TMP, True)
ST_COUNT = itertools.count()
ST_NAMES = ["w", "model.layers.0.self_attn.q_proj.weight", "lm_head.weight", "", "ü-ñame", "with space", 'quote"d', "a" * 300, "0", "embed_tokens"]
TOL = {"f16": 2e-3, "bf16": 1.6e-2, "f32": 2e-5, "f64": 1e-9}


# Ops both libraries compute with one rounding per element: compared bit for bit.
# (Not alpha: PyTorch rounds `alpha * y` of halves on its scalar path, for strided or
# mixed-dtype operands, and not on its vector path.)
EXACT = re.compile(r"^((alias_)?(add|sub|mul|div)(_scalar)?(_|_out)?|st_save|st_load(_copy)?)$")


# Ops whose fresh output is laid out as PyTorch lays it out (`TensorIterator`'s rule for the
# element-wise ones, `preserve_format` for `to`): their strides are compared too.
LAYOUT = re.compile(r"^((add|sub|mul|div|maximum|minimum|pow|eq|ne|lt|le|gt|ge)(_scalar)?|neg|abs|relu|exp|log|sqrt|gelu|gelu_tanh|sigmoid|silu|tanh|add_scaled|sub_scaled|where|to_dtype|zeros_like|full_like)$")


def close(a, b, dt, op):
    if math.isnan(a) and math.isnan(b):
        return True
    if EXACT.match(op):
        return a == b
    if math.isinf(a) or math.isinf(b):
        return a == b
    if dt in TOL:
        tol = TOL[dt] * (8 if op in ("layer_norm", "rms_norm", "softmax", "log_softmax", "matmul", "mean", "mean_dim", "gelu", "pow") or "pow" in op else 2)
        return abs(a - b) <= tol * max(1.0, abs(a), abs(b))
    return a == b


def compare(case, mine, ref):
    """Returns None when they agree, else a string."""
    if isinstance(ref, Exception):
        if mine["ok"]:
            return f"torch refused ({type(ref).__name__}: {str(ref).splitlines()[0][:160]}), we accepted"
        return None
    if not mine["ok"]:
        return f"we refused ({mine['err'][:200]}), torch accepted"
    r = mine["r"]
    if ref.get("skip"):
        return None
    if "text" in ref:
        t = ref["text"]
        for k, v in TD.items():
            t = t.replace("dtype=" + str(v), "dtype=" + k)
        norm = lambda x: x
        t, mine_t = norm(t), norm(r["text"])
        return None if mine_t == t else f"display:\nours:  {r['text']!r}\ntorch: {ref['text']!r}"
        return None if r["text"] == t else f"display:\nours:  {r['text']!r}\ntorch: {t!r}"
    if "size" in ref:
        return None if r["size"] == ref["size"] else f"size {r['size']} vs {ref['size']}"
    if len(r["out"]) != len(ref["out"]):
        return f"{len(r['out'])} outputs vs {len(ref['out'])}"
    for j, (o, t) in enumerate(zip(r["out"], ref["out"])):
        tdt = NAME[t.dtype]
        # Values are compared at the precision of the loosest float dtype involved: an f32
        # input's function written into an f64 out= is computed in f32.
        # (An integer input's float function is computed in f32.)
        dts = [i["dtype"] for i in case["inputs"] if "dtype" in i]
        dts = [d if d in TOL else "f32" for d in dts]
        loose = max([d for d in [tdt] + dts if d in TOL] or [tdt], key=lambda d: TOL.get(d, 0))
        if o["dtype"] != tdt:
            return f"out {j}: dtype {o['dtype']} vs {tdt}"
        if list(o["sizes"]) != list(t.shape):
            return f"out {j}: sizes {o['sizes']} vs {list(t.shape)}"
        if "strides" in o:
            shares = t.untyped_storage().data_ptr() == LAST_BASE.untyped_storage().data_ptr()
            if o["shares"] != shares:
                return f"out {j}: {'a view' if o['shares'] else 'a copy'} vs {'a view' if shares else 'a copy'}"
            if shares and (list(o["strides"]) != list(t.stride()) or o["offset"] != t.storage_offset()):
                return f"out {j}: strides {o['strides']} offset {o['offset']} vs {list(t.stride())} offset {t.storage_offset()}"
        if LAYOUT.match(case["op"]) and not same_layout(o["layout"], t, case["inputs"]):
            return f"out {j}: laid out with strides {o['layout']} vs {list(t.stride())}"
        tv = t.to(torch.float64).flatten().tolist() if t.numel() else []
        ov = [float(v) for v in o["values"]]
        for q, (p, w) in enumerate(zip(ov, tv)):
            if not close(p, w, loose if tdt in TOL else tdt, case["op"]):
                return f"out {j}: value [{q}] {p} vs {w} (ours {ov[:12]} torch {tv[:12]})"
    return None


def same_layout(ours, t, inputs=()):
    """Whether our strides of a fresh output are PyTorch's. PyTorch computes them in bytes, in
    int64: where a stride times the element size reaches 2^63 (only in an empty tensor whose
    nonzero sizes multiply that far), its value wraps and is meaningless (strides of elements
    that do not exist). Those strides are not compared; tensormem's are the exact products,
    saturated at usize::MAX. An empty output of inputs whose byte strides wrap is not compared
    at all: PyTorch orders its dimensions by those wrapped strides."""
    theirs = list(t.stride())
    if t.numel() == 0 and len(ours) == len(theirs):
        if any(st * ELEM.get(i.get("dtype"), 8) >= 2**63 for i in inputs if i.get("strides") for st in i["strides"]):
            return True
        big = 2**63 // t.element_size()
        return all(o == p or o >= big for o, p in zip(ours, theirs))
    return list(ours) == theirs


def main():
    cases = []
    while len(cases) < N:
        c = gen()
        if OPS and not any(c["op"] == o or c["op"].startswith(o) for o in OPS):
            continue
        c["id"] = len(cases)
        cases.append(c)
    enc = lambda c: json.dumps({**c, "inputs": [{**i, "base": [repr(float(v)) for v in i["base"]]} for i in c["inputs"]]})
    if ARGS.dump is not None:
        print("\n".join(enc(c) for c in (cases if ARGS.dump < 0 else [cases[ARGS.dump]])))
        return
    p = subprocess.run([BIN], input="\n".join(enc(c) for c in cases) + "\n", capture_output=True, text=True, timeout=600)
    outs = [json.loads(l) for l in p.stdout.splitlines()]
    if len(outs) != len(cases):
        print("driver died at case", len(outs), p.stderr[-2000:])
        print(json.dumps(cases[len(outs)]))
        sys.exit(2)
    bad, known = 0, {}
    for c, m in zip(cases, outs):
        try:
            ref = t_run(c)
        except Exception as e:  # noqa
            ref = e
        if m.get("panic"):
            diff = "PANIC"
        else:
            diff = compare(c, m, ref)
        if diff:
            line = f"--- case {c['id']} {c['op']} " + json.dumps({k: c[k] for k in ("args",)}) + " inputs " + \
                "; ".join(f"{s['dtype']}{s['sizes']} st{s['strides']} off{s['offset']}" for s in c["inputs"])
            why = next((k for k in KNOWN if k[1] and re.search(k[0], line + " " + diff)), None)
            if why:
                known[why[1]] = known.get(why[1], 0) + 1
                continue
            bad += 1
            print(line)
            print("   ", diff)
    for reason, n in sorted(known.items(), key=lambda kv: -kv[1]):
        print(f"known ({n}): {reason}")
    print(f"{bad} / {len(cases)} differ beyond the known differences")
    sys.exit(1 if bad else 0)


main()

//! Choosing between values by a bool condition: `where_cond`, `masked_fill` (attention masks).

use crate::dtype::match_dtype;
use crate::iter::{Operand, Plan};
use crate::shape::broadcast_shapes;
use crate::storage::lock_storages;
use crate::strides::{Input, elementwise_output};
use crate::{DType, Element, Result, Tensor, TensorError};

use super::elementwise::Scalar;
use super::loops::{prepare_into, strides_to};

/// The hint of the error for a fill value the tensor's dtype cannot hold.
pub(crate) const FILL_HINT: &str =
    "the fill value does not fit the dtype (a number beyond the dtype's range, or an infinity or NaN into integers)";

fn bool_condition(op: &'static str, c: &Tensor) -> Result<()> {
    if c.dtype() != DType::Bool {
        return Err(TensorError::UnsupportedDType {
            op,
            dtype: c.dtype(),
            shape: c.sizes().to_vec(),
            hint: "the condition must be a bool tensor (compare with eq/lt/... to make one)",
        });
    }
    Ok(())
}

/// `out[i] = if cond[i] { x[i] } else { y[i] }` over `out`'s shape, every operand broadcast to
/// it and of `out`'s dtype `T`. `out` may be exactly `y` (an in-place fill): each element is
/// read before it is written.
fn run_where<T: Element>(
    op: &'static str,
    out: &Tensor,
    cond: &Tensor,
    x: &Tensor,
    y: &Tensor,
    write: bool,
) -> Result<()> {
    let (sc, sx, sy) =
        (strides_to(op, cond, out.sizes())?, strides_to(op, x, out.sizes())?, strides_to(op, y, out.sizes())?);
    if out.numel() == 0 {
        return Ok(());
    }
    for t in [cond, x, y, out] {
        t.host_ready(op)?;
    }
    let _g = lock_storages(op, write.then(|| out.storage()), &[cond.storage(), x.storage(), y.storage()])?;
    let op_of = |t: &Tensor, s| Operand { ptr: t.data_ptr(), strides: s, elem: t.elem_size() };
    let plan = Plan::new(out.sizes(), [op_of(out, out.strides()), op_of(cond, &sc), op_of(x, &sx), op_of(y, &sy)]);
    // SAFETY: the plan walks every operand inside its storage with its element size; the
    // dtypes are `T` (x, y, out) and bool (cond), as checked by the callers; `out` is fresh or
    // writable with distinct elements (`prepare_into`), and overlaps `x`/`y` only element for
    // element, which the loop reads before it writes.
    plan.run(true, &|p, s, n| unsafe {
        let (o, c, a, b) = (p[0] as *mut T, p[1] as *const bool, p[2] as *const T, p[3] as *const T);
        for i in 0..n {
            let v = if c.byte_add(i * s[1]).read() { a.byte_add(i * s[2]).read() } else { b.byte_add(i * s[3]).read() };
            o.byte_add(i * s[0]).write(v);
        }
    });
    Ok(())
}

impl Tensor {
    /// `self` where `condition` is true, `other` elsewhere (`torch.where(condition, self,
    /// other)`), all three broadcast; the result has the promoted dtype of `self` and `other`.
    ///
    /// ```
    /// use tensormem_tensor::{DType, Tensor};
    ///
    /// let x = Tensor::arange(0.0, 4.0, 1.0, DType::F32)?;
    /// let keep = x.gt_scalar(1.5)?;
    /// let y = x.where_cond(&keep, &Tensor::scalar(-1.0, DType::F32)?)?;
    /// assert_eq!(y.to_vec::<f32>()?, [-1., -1., 2., 3.]);
    /// # Ok::<(), tensormem_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    /// [`TensorError::UnsupportedDType`] for a non-bool condition; [`TensorError::Broadcast`];
    /// [`TensorError::NoCommonDType`].
    pub fn where_cond(&self, condition: &Tensor, other: &Tensor) -> Result<Tensor> {
        let op = "where_cond";
        bool_condition(op, condition)?;
        let shape = broadcast_shapes(op, &broadcast_shapes(op, condition.sizes(), self.sizes())?, other.sizes())?;
        let dt = DType::result_type(self.dtype(), self.dim() == 0, other.dtype(), other.dim() == 0)
            .ok_or(TensorError::NoCommonDType { op, lhs: self.dtype(), rhs: other.dtype() })?;
        let x = self.to_dtype(dt)?;
        let y = other.to_dtype(dt)?;
        let inputs = [Input::of(condition, DType::Bool), Input::of(&x, dt), Input::of(&y, dt)];
        // SAFETY: `run_where` writes every element or fails, dropping `out` unread.
        let out = unsafe { elementwise_output(op, &shape, dt, self, &inputs) }?;
        match_dtype!(dt, T => run_where::<T>(op, &out, condition, &x, &y, false)?, _ => {});
        Ok(out)
    }

    /// `value` where `mask` is true, `self` elsewhere (`masked_fill`), `self` and `mask`
    /// broadcast together as in PyTorch; the result keeps `self`'s dtype.
    ///
    /// ```
    /// use tensormem_tensor::{DType, Tensor};
    ///
    /// // A causal attention mask: -inf above the diagonal.
    /// let scores = Tensor::zeros(&[3, 3], DType::F32)?;
    /// let i = Tensor::arange(0.0, 3.0, 1.0, DType::I64)?;
    /// let future = i.unsqueeze(0)?.gt(&i.unsqueeze(1)?)?;
    /// let masked = scores.masked_fill(&future, f64::NEG_INFINITY)?;
    /// assert_eq!(masked.get::<f32>(&[0, 2])?, f32::NEG_INFINITY);
    /// assert_eq!(masked.get::<f32>(&[2, 0])?, 0.0);
    /// # Ok::<(), tensormem_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    /// [`TensorError::UnsupportedDType`] for a non-bool mask or a value `self`'s dtype cannot
    /// hold, as PyTorch refuses it (an infinity, NaN or 1000 into `i8`, -1.0 into `u8`; the
    /// integer -1 into `u8` is 255); [`TensorError::Broadcast`] when the shapes do not
    /// broadcast.
    pub fn masked_fill(&self, mask: &Tensor, value: impl Into<Scalar>) -> Result<Tensor> {
        let op = "masked_fill";
        let v = self.fill_value(op, mask, value.into())?;
        let shape = broadcast_shapes(op, mask.sizes(), self.sizes())?;
        // SAFETY: `run_where` writes every element or fails.
        let out = unsafe { Tensor::output(op, &shape, self.dtype(), self) }?;
        match_dtype!(self.dtype(), T => run_where::<T>(op, &out, mask, &v, self, false)?, _ => {});
        Ok(out)
    }

    /// In-place [`masked_fill`](Self::masked_fill).
    ///
    /// # Errors
    /// As [`masked_fill`](Self::masked_fill); [`TensorError::BadShape`] when the mask does not
    /// broadcast to `self`'s shape; [`TensorError::ReadOnly`]; [`TensorError::InternalOverlap`].
    pub fn masked_fill_(&self, mask: &Tensor, value: impl Into<Scalar>) -> Result<&Tensor> {
        let op = "masked_fill_";
        let v = self.fill_value(op, mask, value.into())?;
        let shape = broadcast_shapes(op, mask.sizes(), self.sizes())?;
        if *shape != *self.sizes() {
            return Err(TensorError::BadShape {
                op,
                shape: self.sizes().to_vec(),
                target: mask.sizes().to_vec(),
                reason: "the mask must broadcast to the tensor's shape",
            });
        }
        let p = prepare_into(op, self, &[mask])?;
        match_dtype!(self.dtype(), T => run_where::<T>(op, self, &p.inputs[0], &v, self, true)?, _ => {});
        Ok(self)
    }

    /// Checks a fill's mask and makes the value a 0-d tensor of `self`'s dtype.
    fn fill_value(&self, op: &'static str, mask: &Tensor, value: Scalar) -> Result<Tensor> {
        bool_condition(op, mask)?;
        if self.dtype().is_quantized() {
            return Err(TensorError::quantized(op, self));
        }
        // As PyTorch, the value is converted to the tensor's dtype; one the dtype cannot hold
        // is refused.
        if !value.fits(self.dtype()) {
            return Err(TensorError::UnsupportedDType {
                op,
                dtype: self.dtype(),
                shape: self.sizes().to_vec(),
                hint: FILL_HINT,
            });
        }
        value.to_tensor(op, self.dtype(), self.options())
    }
}

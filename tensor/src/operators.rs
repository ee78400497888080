//! Operator sugar: `&a + &b`, `a * b`, `-&a`, ... They panic on error with the message the
//! fallible method ([`Tensor::add`] and friends) would return; use the methods to handle
//! errors.

use core::ops::{Add, Div, Mul, Neg, Sub};

use super::Tensor;

macro_rules! binary_operator {
    ($($trait:ident, $method:ident;)*) => {$(
        impl $trait<&Tensor> for &Tensor {
            type Output = Tensor;
            /// # Panics
            /// When the fallible method returns an error, with its message.
            fn $method(self, rhs: &Tensor) -> Tensor {
                Tensor::$method(self, rhs).unwrap_or_else(|e| panic!("{e}"))
            }
        }
        impl $trait<Tensor> for Tensor {
            type Output = Tensor;
            /// # Panics
            /// When the fallible method returns an error, with its message.
            fn $method(self, rhs: Tensor) -> Tensor {
                Tensor::$method(&self, &rhs).unwrap_or_else(|e| panic!("{e}"))
            }
        }
        impl $trait<&Tensor> for Tensor {
            type Output = Tensor;
            /// # Panics
            /// When the fallible method returns an error, with its message.
            fn $method(self, rhs: &Tensor) -> Tensor {
                Tensor::$method(&self, rhs).unwrap_or_else(|e| panic!("{e}"))
            }
        }
        impl $trait<Tensor> for &Tensor {
            type Output = Tensor;
            /// # Panics
            /// When the fallible method returns an error, with its message.
            fn $method(self, rhs: Tensor) -> Tensor {
                Tensor::$method(self, &rhs).unwrap_or_else(|e| panic!("{e}"))
            }
        }
    )*};
}

binary_operator! {
    Add, add;
    Sub, sub;
    Mul, mul;
    Div, div;
}

impl Neg for &Tensor {
    type Output = Tensor;
    /// # Panics
    /// When [`Tensor::neg`] returns an error (bool tensors), with its message.
    fn neg(self) -> Tensor {
        Tensor::neg(self).unwrap_or_else(|e| panic!("{e}"))
    }
}

impl Neg for Tensor {
    type Output = Tensor;
    /// # Panics
    /// As for `&Tensor`.
    fn neg(self) -> Tensor {
        Tensor::neg(&self).unwrap_or_else(|e| panic!("{e}"))
    }
}

macro_rules! scalar_operator {
    ($($trait:ident, $method:ident, $scalar:ident;)*) => {$(
        impl $trait<f64> for &Tensor {
            type Output = Tensor;
            /// A number as the right operand (see [`Scalar`](super::Scalar) for the dtype).
            ///
            /// # Panics
            /// When the fallible method returns an error, with its message.
            fn $method(self, rhs: f64) -> Tensor {
                Tensor::$scalar(self, rhs).unwrap_or_else(|e| panic!("{e}"))
            }
        }
        impl $trait<f64> for Tensor {
            type Output = Tensor;
            /// As for `&Tensor`.
            ///
            /// # Panics
            /// When the fallible method returns an error, with its message.
            fn $method(self, rhs: f64) -> Tensor {
                Tensor::$scalar(&self, rhs).unwrap_or_else(|e| panic!("{e}"))
            }
        }
        impl $trait<&Tensor> for f64 {
            type Output = Tensor;
            /// A number as the left operand: `2.0 - &x`, `1.0 / &x`.
            ///
            /// # Panics
            /// When the operation fails, with its message.
            fn $method(self, rhs: &Tensor) -> Tensor {
                rhs.scalar_first(super::kernels::BinaryOp::$trait, self).unwrap_or_else(|e| panic!("{e}"))
            }
        }
        impl $trait<Tensor> for f64 {
            type Output = Tensor;
            /// As for `&Tensor`.
            ///
            /// # Panics
            /// When the operation fails, with its message.
            fn $method(self, rhs: Tensor) -> Tensor {
                rhs.scalar_first(super::kernels::BinaryOp::$trait, self).unwrap_or_else(|e| panic!("{e}"))
            }
        }
    )*};
}

scalar_operator! {
    Add, add, add_scalar;
    Sub, sub, sub_scalar;
    Mul, mul, mul_scalar;
    Div, div, div_scalar;
}

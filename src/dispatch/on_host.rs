//! The CPU backend's view of an op's arguments: host values as they are, device values (a
//! GEMM's bias among them) an error naming the op (modules move to a device whole, so a device
//! value reaching a CPU op is a bug, reported instead of a panic); every other argument passes
//! through.

use crate::error::Result;
use crate::gemm::{GemmParams, Output};
use crate::tensor::device_values::{Values, ValuesMut};

pub(crate) trait OnHost {
    /// The argument as the CPU reference function takes it.
    type Host;
    fn on_host(self, op: &'static str) -> Result<Self::Host>;
}

impl<'a> OnHost for Values<'a> {
    type Host = &'a [f32];
    fn on_host(self, op: &'static str) -> Result<&'a [f32]> {
        self.host(op)
    }
}

impl<'a> OnHost for ValuesMut<'a> {
    type Host = &'a mut [f32];
    fn on_host(self, op: &'static str) -> Result<&'a mut [f32]> {
        self.host(op)
    }
}

impl<'a, T: ?Sized> OnHost for &'a T {
    type Host = &'a T;
    fn on_host(self, _: &'static str) -> Result<&'a T> {
        Ok(self)
    }
}

impl<'a, T: ?Sized> OnHost for &'a mut T {
    type Host = &'a mut T;
    fn on_host(self, _: &'static str) -> Result<&'a mut T> {
        Ok(self)
    }
}

/// A GEMM's scalars, with its bias in host memory (one on a GPU is an error, as any value).
impl<'a> OnHost for GemmParams<'a> {
    type Host = GemmParams<'a>;
    fn on_host(self, op: &'static str) -> Result<GemmParams<'a>> {
        crate::gemm::host_bias(&self, op)?;
        Ok(self)
    }
}

impl<'a> OnHost for Output<'a> {
    type Host = Output<'a>;
    fn on_host(self, _: &'static str) -> Result<Output<'a>> {
        Ok(self)
    }
}

macro_rules! on_host_by_value {
    ($($ty:ty),*) => {$(
        impl OnHost for $ty {
            type Host = $ty;
            fn on_host(self, _: &'static str) -> Result<$ty> {
                Ok(self)
            }
        }
    )*};
}

by_value_args!(on_host_by_value);

//! A bare module for the unit tests: a list of parameters and optional FP8 slots.

use crate::nn::{Module, Parameter};
use crate::scaling::DelayedSlot;

/// Parameters and named delayed-scaling slots, visited in order.
#[derive(Clone, Debug, Default)]
pub struct ParamList {
    pub params: Vec<Parameter>,
    pub slots: Vec<(String, DelayedSlot)>,
}

impl ParamList {
    /// One parameter per `(name, shape, values)`.
    pub fn new(specs: &[(&str, &[usize], Vec<f32>)]) -> Self {
        ParamList {
            params: specs
                .iter()
                .map(|(name, shape, values)| Parameter::new(*name, shape, values.clone()).unwrap())
                .collect(),
            slots: Vec::new(),
        }
    }
}

impl Module for ParamList {
    fn visit_parameters(&mut self, f: &mut dyn FnMut(&mut Parameter)) {
        self.params.iter_mut().for_each(f);
    }

    fn visit_fp8_slots(&mut self, f: &mut dyn FnMut(&str, &mut DelayedSlot)) {
        for (name, slot) in &mut self.slots {
            f(name, slot);
        }
    }
}

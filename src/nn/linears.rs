//! Walking the linear layers inside a module, in a fixed order: LoRA attaches, lists and
//! merges its adapters through it. A trait of its own (not a `Module` method) so that `param`,
//! which every layer imports, does not depend on `linear`.

use super::linear::Linear;

/// A module that holds linear layers.
pub trait VisitLinears {
    /// Calls `f` on every [`Linear`] inside, in a fixed order.
    fn visit_linears(&mut self, f: &mut dyn FnMut(&mut Linear));
}

impl VisitLinears for Linear {
    fn visit_linears(&mut self, f: &mut dyn FnMut(&mut Linear)) {
        f(self);
    }
}

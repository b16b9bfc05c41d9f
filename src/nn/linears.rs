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

/// Where every GEMM set inside `m` (a linear's own, then its adapters') stands with its weight
/// copy, in visit order: the copy's version (`None` before one is made) and whether its amax is
/// still to be recorded (an installed copy's). Taken before a forward-only pass for
/// [`defer_weight_records`].
pub(crate) fn weight_copy_states(m: &mut dyn VisitLinears) -> Vec<(Option<u64>, bool)> {
    let mut out = Vec::new();
    m.visit_linears(&mut |l| l.visit_gemms(&mut |g| out.push((g.weight_version(), g.weight_record_pending()))));
    out
}

/// After a forward-only pass whose FP8 slots were put back as they were: every GEMM set whose
/// weight copy the pass made (its version differs from `before`'s), or whose pending record the
/// pass took, keeps that cast's amax and statistics for its next training forward to record, as
/// that forward finds the copy made and casts nothing. Without it, a held-out evaluation between
/// two steps would leave a zero in the weight's amax history where the run without it has the
/// weight's amax.
pub(crate) fn defer_weight_records(m: &mut dyn VisitLinears, before: &[(Option<u64>, bool)]) {
    let mut before = before.iter();
    m.visit_linears(&mut |l| {
        l.visit_gemms(&mut |g| {
            let Some(&(version, pending)) = before.next() else {
                return;
            };
            if version != g.weight_version() || (pending && !g.weight_record_pending()) {
                g.defer_weight_record();
            }
        })
    });
}

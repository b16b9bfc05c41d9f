//! ZeRO stage 1: AdamW whose moments are sharded over the ranks. The trainable values, in
//! visiting order, form one flat vector; rank `r` owns [`shard_range`]`(total, world, r)` of it,
//! keeps the two moments of those values only, and updates only them; an all-gather then gives
//! every rank every updated value (`docs/distributed.md`, ZeRO-1).
//!
//! AdamW is element-wise, so each value gets the bits the unsharded optimizer gives it (same
//! gradient, same moments, same per-step scalars). What is saved: `8 * total * (1 - 1/world)`
//! bytes of moments per rank, and with sharded masters ([`crate::train::zero1_masters`]) the f32
//! values of the linear weights outside the rank's shard: their compute copies are gathered
//! instead of their f32 values.

use std::ops::Range;

use crate::dispatch::Backend;
use crate::dist::collective::Collective;
use crate::dist::shard::{overlap, shard_len, shard_range};
use crate::error::{Error, Result};
use crate::nn::{Module, VisitLinears};
use crate::train::adamw::{AdamW, AdamWConfig, AdamWState, Moments, for_parameter, step_scalars};
use crate::train::zero1_masters::ShardedMasters;

/// One parameter's part of this rank's shard.
#[derive(Clone, Debug)]
struct Piece {
    /// Index of the parameter in visiting order.
    param: usize,
    /// The values of the parameter this rank owns.
    range: Range<usize>,
    m: Vec<f32>,
    v: Vec<f32>,
}

/// This rank's part of a sharded AdamW.
#[derive(Clone, Debug)]
pub struct Zero1AdamW {
    config: AdamWConfig,
    step: u64,
    rank: usize,
    world: usize,
    /// Trainable values of the model (the flat vector's length).
    total: usize,
    pieces: Vec<Piece>,
    backend: Backend,
    /// Sharded linear-weight masters, when the run shards them.
    masters: Option<ShardedMasters>,
}

/// `(name, shape, len)` of every parameter, in visiting order.
fn inventory<M: Module + ?Sized>(model: &mut M) -> Vec<(String, Vec<usize>, usize)> {
    let mut out = Vec::new();
    model.visit_parameters(&mut |p| out.push((p.name().to_string(), p.shape().to_vec(), p.len())));
    out
}

impl Zero1AdamW {
    /// Rank `collective.rank()`'s shard of `full` (a fresh optimizer, or one loaded from a
    /// checkpoint) for `model` (holding whole masters); the moments outside the shard are
    /// dropped. With `shard_masters`, so are the f32 values of the linear weights outside the
    /// shard, and the layers get their compute copies gathered from the ranks' slices (every
    /// rank of the group must call it then).
    pub fn from_full<M: Module + VisitLinears + ?Sized>(
        full: &AdamW,
        model: &mut M,
        collective: &dyn Collective,
        shard_masters: bool,
    ) -> Result<Self> {
        let params = inventory(model);
        let total: usize = params.iter().map(|p| p.2).sum();
        let (rank, world) = (collective.rank(), collective.world_size());
        let state = full.state()?;
        if !state.moments.is_empty() && state.moments.len() != params.len() {
            return Err(Error::InvalidTensor {
                name: "adamw".into(),
                reason: format!(
                    "optimizer state has {} parameters, the module has {}",
                    state.moments.len(),
                    params.len()
                ),
            });
        }
        let shard = shard_range(total, world, rank);
        let mut pieces = Vec::new();
        let mut offset = 0;
        for (index, (name, _, len)) in params.iter().enumerate() {
            if let Some(range) = overlap(offset..offset + len, &shard) {
                let (m, v) = match state.moments.get(index) {
                    Some(moments) if moments.m.len() == *len && moments.v.len() == *len && moments.name == *name => {
                        (moments.m[range.clone()].to_vec(), moments.v[range.clone()].to_vec())
                    }
                    Some(moments) => {
                        return Err(Error::InvalidTensor {
                            name: name.clone(),
                            reason: format!(
                                "optimizer state is for '{}' of {} values",
                                moments.name,
                                moments.m.len()
                            ),
                        });
                    }
                    None => (vec![0.0; range.len()], vec![0.0; range.len()]),
                };
                pieces.push(Piece {
                    param: index,
                    range,
                    m,
                    v,
                });
            }
            offset += len;
        }
        let masters = shard_masters
            .then(|| ShardedMasters::plan(model, world, rank))
            .filter(ShardedMasters::any);
        if let Some(masters) = &masters {
            masters.drop_others(model);
            masters.gather_step(model, collective)?;
        }
        Ok(Zero1AdamW {
            config: *full.config(),
            step: state.step,
            rank,
            world,
            total,
            pieces,
            backend: full.backend(),
            masters,
        })
    }

    /// f32 master values this rank does not hold (0 unless the masters are sharded).
    pub fn master_values_not_held(&self) -> usize {
        self.masters.as_ref().map_or(0, ShardedMasters::values_not_held)
    }

    /// Gives every rank the whole f32 masters back for good: call it once the optimizer is done
    /// ([`Self::step`] and [`Self::master_values_not_held`] assume sharded masters). Every rank
    /// of the group must call it.
    pub(crate) fn unshard_masters<M: Module + ?Sized>(&self, model: &mut M, collective: &dyn Collective) -> Result<()> {
        match &self.masters {
            Some(masters) => masters.gather_whole(model, collective),
            None => Ok(()),
        }
    }

    /// Runs `f` with the whole f32 masters on every rank (gathered, then sharded again after
    /// `f`): what a checkpoint needs. Every rank of the group must call it.
    pub(crate) fn with_whole_masters<M: Module + ?Sized, T>(
        &self,
        model: &mut M,
        collective: &dyn Collective,
        f: impl FnOnce(&mut M) -> Result<T>,
    ) -> Result<T> {
        let Some(masters) = &self.masters else {
            return f(model);
        };
        masters.gather_whole(model, collective)?;
        let out = f(model);
        masters.drop_others(model);
        out
    }

    /// The backend the updates run on.
    pub(crate) fn backend(&self) -> Backend {
        self.backend.clone()
    }

    /// Steps taken.
    pub fn steps_taken(&self) -> u64 {
        self.step
    }

    /// Bytes of moments this rank holds (two f32 per owned value).
    pub fn state_bytes(&self) -> usize {
        self.pieces.iter().map(|p| 4 * (p.m.len() + p.v.len())).sum()
    }

    /// The values this rank owns, as a range of the flat vector.
    pub fn shard(&self) -> Range<usize> {
        shard_range(self.total, self.world, self.rank)
    }

    fn check_group(&self, collective: &dyn Collective) -> Result<()> {
        if collective.rank() != self.rank || collective.world_size() != self.world {
            return Err(Error::Collective {
                op: "zero1",
                rank: collective.rank(),
                reason: format!(
                    "the optimizer shard is rank {} of {}, the group says rank {} of {}",
                    self.rank,
                    self.world,
                    collective.rank(),
                    collective.world_size()
                ),
            });
        }
        Ok(())
    }

    /// Updates the owned values of `model` from their (already all-reduced) gradients, then
    /// all-gathers every value so each rank holds the whole updated model (sharded masters:
    /// the replicated values and the sharded weights' compute copies); every parameter is
    /// marked updated. Every rank of the group must call it.
    pub fn step<M: Module + VisitLinears + ?Sized>(
        &mut self,
        model: &mut M,
        lr: f32,
        collective: &dyn Collective,
    ) -> Result<()> {
        AdamW::check_lr(lr)?;
        self.check_group(collective)?;
        let params = inventory(model);
        let total: usize = params.iter().map(|p| p.2).sum();
        if total != self.total {
            return Err(Error::InvalidTensor {
                name: "adamw".into(),
                reason: format!("the optimizer shards {} values, the module has {total}", self.total),
            });
        }
        let t = self.step + 1;
        let step = step_scalars(&self.config, lr, t);
        let kernels = self.backend.kernels();
        let shard = self.shard();
        let len = shard_len(self.total, self.world);
        let mut mine = vec![0.0f32; len];
        let mut pieces = self.pieces.iter_mut().peekable();
        let (mut index, mut offset, mut result) = (0usize, 0usize, Ok(()));
        let decay_vectors = self.config.decay_vectors;
        model.visit_parameters(&mut |p| {
            if let Some(piece) = pieces.next_if(|piece| piece.param == index) {
                let step = for_parameter(step, decay_vectors, p.shape());
                let (held, p_len) = (p.held_range(), p.len());
                let (value, grad) = p.value_and_grad_mut();
                if held.start > piece.range.start || held.end < piece.range.end || held.len() != value.len() {
                    result = Err(Error::LengthMismatch {
                        what: "zero1 held values vs owned piece",
                        src: value.len(),
                        dst: piece.range.len(),
                    });
                    return;
                }
                if grad.len() != p_len {
                    result = Err(Error::LengthMismatch {
                        what: "zero1 gradient vs parameter",
                        src: grad.len(),
                        dst: p_len,
                    });
                    return;
                }
                // A sharded master holds exactly the owned piece; a whole one, all of it.
                let at = piece.range.start - held.start;
                let (value, grad) = (&mut value[at..at + piece.range.len()], &mut grad[piece.range.clone()]);
                if result.is_ok() {
                    result = kernels.adamw(value, grad, &mut piece.m, &mut piece.v, &step);
                }
                let at = offset + piece.range.start - shard.start;
                mine[at..at + value.len()].copy_from_slice(value);
            }
            offset += p.len();
            index += 1;
        });
        result?;
        if let Some(masters) = &self.masters {
            model.visit_parameters(&mut |p| p.mark_updated());
            masters.gather_step(model, collective)?;
            self.step = t;
            return Ok(());
        }
        let mut all = vec![0.0f32; len * self.world];
        collective.all_gather(&mine, &mut all)?;
        let mut offset = 0;
        let mut result = Ok(());
        model.visit_parameters(&mut |p| {
            let n = p.len();
            // Where the values live (a layer on a GPU keeps them there): nothing downloaded.
            if result.is_ok() {
                result = p.write_value(&all[offset..offset + n]);
            }
            p.mark_updated();
            offset += n;
        });
        result?;
        self.step = t;
        Ok(())
    }

    /// The whole optimizer state (every rank's moments, gathered), as the unsharded AdamW holds
    /// it: what a checkpoint saves. Every rank of the group must call it.
    pub fn full_state<M: Module + ?Sized>(&self, model: &mut M, collective: &dyn Collective) -> Result<AdamWState> {
        self.check_group(collective)?;
        if self.step == 0 {
            return Ok(AdamWState::default());
        }
        let params = inventory(model);
        let len = shard_len(self.total, self.world);
        let shard = self.shard();
        let mut gathered = Vec::with_capacity(2);
        let picks: [fn(&Piece) -> &Vec<f32>; 2] = [|p| &p.m, |p| &p.v];
        for pick in picks {
            let mut mine = vec![0.0f32; len];
            for piece in &self.pieces {
                let start: usize = params[..piece.param].iter().map(|p| p.2).sum::<usize>() + piece.range.start;
                let at = start - shard.start;
                mine[at..at + piece.range.len()].copy_from_slice(pick(piece));
            }
            let mut all = vec![0.0f32; len * self.world];
            collective.all_gather(&mine, &mut all)?;
            gathered.push(all);
        }
        let mut moments = Vec::with_capacity(params.len());
        let mut offset = 0;
        for (name, shape, n) in params {
            moments.push(Moments {
                name,
                shape,
                m: gathered[0][offset..offset + n].to_vec(),
                v: gathered[1][offset..offset + n].to_vec(),
            });
            offset += n;
        }
        Ok(AdamWState {
            step: self.step,
            moments,
        })
    }

    /// An unsharded AdamW holding [`Self::full_state`], for writing a checkpoint.
    pub fn to_full<M: Module + ?Sized>(&self, model: &mut M, collective: &dyn Collective) -> Result<AdamW> {
        let mut full = AdamW::new(self.config)?;
        full.set_state(self.full_state(model, collective)?);
        Ok(full)
    }
}

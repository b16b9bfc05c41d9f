//! ZeRO-1 with sharded f32 masters (`docs/distributed.md`, ZeRO-1): a linear weight's f32
//! values are kept only by the rank whose shard of the flat vector holds them. After the
//! update each rank casts its slice to the layer's compute format, the ranks all-gather the
//! cast slices, and every rank installs the whole compute copy in the layer, keyed by the
//! weight's version, so the layer never casts it itself. The casts are element-wise (bf16/fp16
//! rounding; FP8 with the delayed slot's scale, which every rank shares), so the gathered copy
//! has the bits the layer would cast from the whole tensor; the FP8 weight amax and statistics
//! are the whole tensor's too (max and counts over the slices, gathered with the codes).
//!
//! Sharded: weights of linear layers whose compute copy is bf16, fp16, or FP8 under delayed
//! scaling, with no adapters and not frozen ([`crate::nn::Linear::weight_slice_cast`]).
//! Everything else stays replicated in f32 and travels in f32, as ZeRO-1 without sharded
//! masters does: embeddings, norms and biases (their ops read the f32 values), fp32 runs
//! (their compute weights are the masters), and the current, block and MXFP8 recipes (their
//! scales need the whole tensor's amax or slices aligned to scale blocks).
//!
//! One all-gather carries everything, as raw bits in f32 words (a gather copies, it adds
//! nothing): per rank, the owned values of every replicated parameter (one word each), then
//! the cast slice of every sharded weight (two bf16/fp16 values or four FP8 codes per word),
//! then one header per FP8 weight (the slice's amax and its four statistics counts).

use std::collections::HashMap;
use std::ops::Range;

use half::{bf16, f16};

use crate::dispatch::{Cast, Halves, PlainMat, fp8_cast};
use crate::dist::collective::Collective;
use crate::dist::shard::{overlap, shard_range};
use crate::error::{Error, Result};
use crate::format::Fp8Format;
use crate::nn::{Module, VisitLinears, WeightSliceCast};
use crate::quantize::{cast_amax, transpose_codes};
use crate::tensor::{Dtype, QuantizedMatrix, QuantizedTensor, Scales};

/// How a sharded weight travels: 16-bit values or FP8 codes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Wire {
    Bits16,
    Fp8,
}

/// Words of an FP8 weight's header: amax, then four u64 counts as two words each.
const HEADER_WORDS: usize = 9;

/// Words `n` values take on the wire (`None`: a replicated f32 value).
fn words(wire: Option<Wire>, n: usize) -> usize {
    match wire {
        None => n,
        Some(Wire::Bits16) => n.div_ceil(2),
        Some(Wire::Fp8) => n.div_ceil(4),
    }
}

/// The sharding of a model's masters: which parameters (visiting order) are sharded weights.
#[derive(Clone, Debug)]
pub(crate) struct ShardedMasters {
    /// Per parameter: `Some` for a sharded linear weight.
    wires: Vec<Option<Wire>>,
    /// Per parameter: its values' range in the flat vector.
    spans: Vec<Range<usize>>,
    /// Name to parameter index, for the sharded weights.
    index: HashMap<String, usize>,
    total: usize,
    world: usize,
    rank: usize,
}

fn internal(what: String) -> Error {
    Error::Collective {
        op: "zero1 masters",
        rank: 0,
        reason: what,
    }
}

impl ShardedMasters {
    /// Plans the sharding of `model` (whole masters on every rank: a fresh or just-loaded
    /// model) over `world` ranks, without changing anything.
    pub(crate) fn plan<M: Module + VisitLinears + ?Sized>(model: &mut M, world: usize, rank: usize) -> Self {
        let mut eligible: HashMap<String, Wire> = HashMap::new();
        model.visit_linears(&mut |linear| {
            let wire = match linear.weight_slice_cast() {
                Some(WeightSliceCast::Plain(_)) => Wire::Bits16,
                Some(WeightSliceCast::Fp8 { .. }) => Wire::Fp8,
                None => return,
            };
            eligible.insert(linear.weight().name().to_string(), wire);
        });
        let (mut wires, mut spans, mut index, mut offset) = (Vec::new(), Vec::new(), HashMap::new(), 0usize);
        model.visit_parameters(&mut |p| {
            let wire = eligible.get(p.name()).copied();
            if wire.is_some() {
                index.insert(p.name().to_string(), wires.len());
            }
            wires.push(wire);
            spans.push(offset..offset + p.len());
            offset += p.len();
        });
        ShardedMasters {
            wires,
            spans,
            index,
            total: offset,
            world,
            rank,
        }
    }

    /// Whether any weight is sharded.
    pub(crate) fn any(&self) -> bool {
        !self.index.is_empty()
    }

    /// Whether parameter `param` (visiting order) is a sharded weight.
    pub(crate) fn is_sharded(&self, param: usize) -> bool {
        self.wires.get(param).is_some_and(Option::is_some)
    }

    /// The part of parameter `param` rank `rank` owns, inside the parameter.
    fn piece(&self, param: usize, rank: usize) -> Option<Range<usize>> {
        overlap(self.spans[param].clone(), &shard_range(self.total, self.world, rank))
    }

    /// f32 values this rank does not hold (the sharded weights' other ranks' parts).
    pub(crate) fn values_not_held(&self) -> usize {
        (0..self.wires.len())
            .filter(|&i| self.is_sharded(i))
            .map(|i| self.spans[i].len() - self.piece(i, self.rank).map_or(0, |r| r.len()))
            .sum()
    }

    /// Words rank `rank` sends in a step's gather.
    fn rank_words(&self, rank: usize) -> usize {
        let pieces: usize = (0..self.wires.len())
            .map(|i| words(self.wires[i], self.piece(i, rank).map_or(0, |r| r.len())))
            .sum();
        pieces + HEADER_WORDS * self.fp8_count()
    }

    fn fp8_count(&self) -> usize {
        self.wires.iter().filter(|w| **w == Some(Wire::Fp8)).count()
    }

    /// Drops, on this rank, every sharded weight's values outside its piece.
    pub(crate) fn drop_others<M: Module + ?Sized>(&self, model: &mut M) {
        let mut i = 0;
        model.visit_parameters(&mut |p| {
            if self.is_sharded(i) && !p.is_sharded() {
                p.keep_only(self.piece(i, self.rank).unwrap_or(0..0));
            }
            i += 1;
        });
    }

    /// Gives every rank the whole f32 values of the sharded weights back (for a checkpoint;
    /// [`Self::drop_others`] shards them again). Every rank of the group must call it.
    pub(crate) fn gather_whole<M: Module + ?Sized>(&self, model: &mut M, collective: &dyn Collective) -> Result<()> {
        let sharded = |rank: usize| -> usize {
            (0..self.wires.len())
                .filter(|&i| self.is_sharded(i))
                .map(|i| self.piece(i, rank).map_or(0, |r| r.len()))
                .sum()
        };
        let len = (0..self.world).map(sharded).max().unwrap_or(0);
        let mut mine = Vec::with_capacity(len);
        let mut i = 0;
        model.visit_parameters(&mut |p| {
            if self.is_sharded(i) {
                mine.extend_from_slice(p.value());
            }
            i += 1;
        });
        mine.resize(len, 0.0);
        let mut all = vec![0.0f32; len * self.world];
        collective.all_gather(&mine, &mut all)?;
        let mut at: Vec<usize> = (0..self.world).map(|r| r * len).collect();
        let mut i = 0;
        model.visit_parameters(&mut |p| {
            if self.is_sharded(i) {
                let mut whole = Vec::with_capacity(self.spans[i].len());
                for (rank, at) in at.iter_mut().enumerate() {
                    let n = self.piece(i, rank).map_or(0, |r| r.len());
                    whole.extend_from_slice(&all[*at..*at + n]);
                    *at += n;
                }
                p.restore_whole(whole);
            }
            i += 1;
        });
        Ok(())
    }

    /// The step's gather: every rank sends its owned replicated values and its cast slices,
    /// receives everyone's, writes the replicated values, installs every sharded weight's
    /// compute copy at the weight's current version. Every rank of the group must call it.
    pub(crate) fn gather_step<M: Module + VisitLinears + ?Sized>(
        &self,
        model: &mut M,
        collective: &dyn Collective,
    ) -> Result<()> {
        let len = (0..self.world).map(|r| self.rank_words(r)).max().unwrap_or(0);
        let mine = self.pack(model)?;
        if mine.len() != self.rank_words(self.rank) {
            return Err(internal(format!(
                "packed {} words, the layout says {}",
                mine.len(),
                self.rank_words(self.rank)
            )));
        }
        let mut padded = mine;
        padded.resize(len, 0.0);
        let mut all = vec![0.0f32; len * self.world];
        collective.all_gather(&padded, &mut all)?;
        self.unpack(model, &all, len)
    }

    /// This rank's words: owned replicated values, cast slices, FP8 headers.
    fn pack<M: Module + VisitLinears + ?Sized>(&self, model: &mut M) -> Result<Vec<f32>> {
        let mut slices: HashMap<usize, (Vec<f32>, Option<[f32; HEADER_WORDS]>)> = HashMap::new();
        let mut result = Ok(());
        model.visit_linears(&mut |linear| {
            let Some(&i) = self.index.get(linear.weight().name()) else {
                return;
            };
            let values = linear.weight().value();
            let packed = match linear.weight_slice_cast() {
                Some(WeightSliceCast::Plain(dtype)) => Ok((pack16(dtype, values), None)),
                Some(WeightSliceCast::Fp8 { format, scale }) => pack_fp8(values, format, scale),
                None => Err(internal(format!("{} lost its slice cast", linear.name()))),
            };
            match packed {
                Ok(p) => {
                    slices.insert(i, p);
                }
                Err(e) => result = Err(e),
            }
        });
        result?;
        let mut words = Vec::with_capacity(self.rank_words(self.rank));
        let mut headers = Vec::new();
        let mut i = 0;
        model.visit_parameters(&mut |p| {
            match (self.wires[i], self.piece(i, self.rank)) {
                (None, Some(range)) => words.extend_from_slice(&p.value()[range]),
                (Some(_), piece) => {
                    let (w, header) = slices.remove(&i).unwrap_or_default();
                    if piece.is_some() {
                        words.extend_from_slice(&w);
                    }
                    if self.wires[i] == Some(Wire::Fp8) {
                        headers.extend(header.unwrap_or([0.0; HEADER_WORDS]));
                    }
                }
                (None, None) => {}
            }
            i += 1;
        });
        words.extend(headers);
        Ok(words)
    }

    fn unpack<M: Module + VisitLinears + ?Sized>(&self, model: &mut M, all: &[f32], len: usize) -> Result<()> {
        // Where each rank's next word is, and where its headers start.
        let mut at: Vec<usize> = (0..self.world).map(|r| r * len).collect();
        let header_start: Vec<usize> = (0..self.world)
            .map(|r| r * len + self.rank_words(r) - HEADER_WORDS * self.fp8_count())
            .collect();
        let mut wholes: HashMap<usize, Whole> = HashMap::new();
        let mut fp8_seen = 0usize;
        let mut i = 0;
        model.visit_parameters(&mut |p| {
            let wire = self.wires[i];
            let mut whole = match wire {
                Some(Wire::Bits16) => Whole::Bits16(Vec::with_capacity(p.len())),
                Some(Wire::Fp8) => Whole::Fp8 {
                    codes: Vec::with_capacity(p.len()),
                    amax: 0.0,
                    counts: [0; 4],
                },
                None => Whole::None,
            };
            for (rank, at) in at.iter_mut().enumerate() {
                let Some(range) = self.piece(i, rank) else { continue };
                let n = range.len();
                let w = &all[*at..*at + words(wire, n)];
                *at += w.len();
                match &mut whole {
                    Whole::None => p.value_mut()[range].copy_from_slice(w),
                    Whole::Bits16(v) => v.extend(w.iter().flat_map(|x| unpack2(*x)).take(n)),
                    Whole::Fp8 { codes, .. } => codes.extend(w.iter().flat_map(|x| x.to_bits().to_le_bytes()).take(n)),
                }
            }
            if let Whole::Fp8 { amax, counts, .. } = &mut whole {
                for start in &header_start {
                    let h = &all[start + HEADER_WORDS * fp8_seen..start + HEADER_WORDS * (fp8_seen + 1)];
                    *amax = amax.max(h[0]);
                    for (k, c) in counts.iter_mut().enumerate() {
                        *c += (u64::from(h[1 + 2 * k].to_bits()) << 32) | u64::from(h[2 + 2 * k].to_bits());
                    }
                }
                fp8_seen += 1;
            }
            if wire.is_some() {
                wholes.insert(i, whole);
            }
            i += 1;
        });
        let mut result = Ok(());
        model.visit_linears(&mut |linear| {
            let Some(i) = self.index.get(linear.weight().name()) else {
                return;
            };
            let Some(whole) = wholes.remove(i) else { return };
            let installed = match (whole, linear.weight_slice_cast()) {
                (Whole::Bits16(bits), Some(WeightSliceCast::Plain(dtype))) => {
                    linear.install_plain_weight(plain_of_bits(dtype, bits))
                }
                (Whole::Fp8 { codes, amax, counts }, Some(WeightSliceCast::Fp8 { format, scale })) => {
                    let (out, inp) = (linear.out_features(), linear.in_features());
                    fp8_copy(codes, out, inp, format, scale, amax)
                        .and_then(|cast| linear.install_fp8_weight(cast, counts))
                }
                _ => Err(internal(format!(
                    "{}: the gathered copy does not match its cast",
                    linear.name()
                ))),
            };
            if let Err(e) = installed {
                result = Err(e);
            }
        });
        result
    }
}

/// A sharded weight's gathered compute copy, before it is installed.
enum Whole {
    None,
    Bits16(Vec<u16>),
    Fp8 {
        codes: Vec<u8>,
        amax: f32,
        counts: [u64; 4],
    },
}

/// `values` rounded to `dtype` (bf16 or fp16, nearest even), two per word.
fn pack16(dtype: Dtype, values: &[f32]) -> Vec<f32> {
    let bits: Vec<u16> = match dtype {
        Dtype::F16 => values.iter().map(|&x| f16::from_f32(x).to_bits()).collect(),
        _ => values.iter().map(|&x| bf16::from_f32(x).to_bits()).collect(),
    };
    bits.chunks(2)
        .map(|pair| f32::from_bits(u32::from(pair[0]) | (u32::from(pair.get(1).copied().unwrap_or(0)) << 16)))
        .collect()
}

fn unpack2(word: f32) -> [u16; 2] {
    let bits = word.to_bits();
    [bits as u16, (bits >> 16) as u16]
}

fn plain_of_bits(dtype: Dtype, bits: Vec<u16>) -> PlainMat {
    match dtype {
        Dtype::F16 => PlainMat::F16(Halves::host(bits.into_iter().map(f16::from_bits).collect()), None),
        _ => PlainMat::Bf16(Halves::host(bits.into_iter().map(bf16::from_bits).collect()), None),
    }
}

/// `values` cast to FP8 with `scale`, four codes per word, and the header: the slice's amax and
/// its statistics counts.
fn pack_fp8(values: &[f32], format: Fp8Format, scale: f32) -> Result<(Vec<f32>, Option<[f32; HEADER_WORDS]>)> {
    let mut codes = vec![0u8; values.len()];
    let amax = cast_amax(values, &mut codes, format, scale)?;
    let counts = fp8_cast::per_tensor_counts(values, &codes, format, scale);
    let mut header = [0.0f32; HEADER_WORDS];
    header[0] = amax;
    for (k, c) in counts.iter().enumerate() {
        header[1 + 2 * k] = f32::from_bits((c >> 32) as u32);
        header[2 + 2 * k] = f32::from_bits(*c as u32);
    }
    let words = codes
        .chunks(4)
        .map(|c| {
            let mut b = [0u8; 4];
            b[..c.len()].copy_from_slice(c);
            f32::from_bits(u32::from_le_bytes(b))
        })
        .collect();
    Ok((words, Some(header)))
}

/// The layer's FP8 weight copy from the gathered row-wise codes: the column-wise copy is their
/// transpose (a per-tensor cast is element-wise, so transposing codes equals casting the
/// transpose).
fn fp8_copy(codes: Vec<u8>, out: usize, inp: usize, format: Fp8Format, scale: f32, amax: f32) -> Result<Cast> {
    let mut transposed = vec![0u8; codes.len()];
    transpose_codes(&codes, out, inp, &mut transposed)?;
    let rowwise = QuantizedMatrix::new(codes, out, inp, Scales::PerTensor(1.0 / scale))?;
    let columnwise = QuantizedMatrix::new(transposed, inp, out, Scales::PerTensor(1.0 / scale))?;
    Ok(Cast {
        tensor: QuantizedTensor::new(format, rowwise, Some(columnwise))?,
        amax: amax.into(),
        scale: scale.into(),
        counts: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sixteen_bit_values_and_fp8_codes_survive_the_words() {
        let values = [1.0f32, -2.5, 0.3, 1e-3, 65504.0];
        for dtype in [Dtype::Bf16, Dtype::F16] {
            let words = pack16(dtype, &values);
            assert_eq!(words.len(), 3);
            let bits: Vec<u16> = words.iter().flat_map(|w| unpack2(*w)).take(values.len()).collect();
            let want: Vec<f64> = PlainMat::new(dtype, &values).widened();
            assert_eq!(plain_of_bits(dtype, bits).widened(), want, "{dtype:?}");
        }
        let (words, header) = pack_fp8(&values, Fp8Format::E4M3, 0.5).expect("cast");
        assert_eq!(words.len(), 2);
        let header = header.expect("an FP8 slice has a header");
        assert_eq!(header[0], 65504.0, "the slice's amax");
        let mut want = vec![0u8; values.len()];
        cast_amax(&values, &mut want, Fp8Format::E4M3, 0.5).expect("cast");
        let codes: Vec<u8> = words
            .iter()
            .flat_map(|w| w.to_bits().to_le_bytes())
            .take(values.len())
            .collect();
        assert_eq!(codes, want);
    }

    /// `(sharded, held range, held values)` of every parameter of `model`, in visiting order.
    fn held<M: Module + ?Sized>(model: &mut M) -> Vec<(bool, Range<usize>, Vec<f32>)> {
        let mut out = Vec::new();
        model.visit_parameters(&mut |p| out.push((p.is_sharded(), p.held_range(), p.value().to_vec())));
        out
    }

    /// Over 2, 3 and 4 ranks, the slices the ranks keep of every sharded weight tile it in order
    /// and hold exactly its unsharded values; every other parameter stays whole on every rank.
    #[test]
    fn the_ranks_slices_add_up_to_the_unsharded_masters() {
        use crate::amp::Precision;
        use crate::dist::cpu_group;
        use crate::model::{DecoderModel, ModelConfig};
        use crate::train::adamw::{AdamW, AdamWConfig};
        use crate::train::zero1::Zero1AdamW;

        let config = ModelConfig {
            hidden: 16,
            heads: 2,
            ffn_hidden: 32,
            ..ModelConfig::default()
        };
        for name in ["bf16", "fp8-delayed"] {
            let precision: Precision = name.parse().expect("precision");
            let build = || DecoderModel::new(&config, &precision, 7).expect("model");
            let whole = held(&mut build());
            for world in [2usize, 3, 4] {
                let group = cpu_group(world).expect("group");
                let ranks: Vec<_> = std::thread::scope(|s| {
                    let handles: Vec<_> = group
                        .iter()
                        .map(|c| {
                            s.spawn(|| {
                                let mut model = build();
                                let full = AdamW::new(AdamWConfig::default()).expect("adamw");
                                let zero = Zero1AdamW::from_full(&full, &mut model, c, true).expect("shard");
                                (held(&mut model), zero.master_values_not_held())
                            })
                        })
                        .collect();
                    handles.into_iter().map(|h| h.join().expect("rank")).collect()
                });
                let mut sharded_values = 0;
                for (i, (_, _, values)) in whole.iter().enumerate() {
                    let mut pieces: Vec<_> = ranks.iter().map(|(h, _)| &h[i]).collect();
                    if !pieces[0].0 {
                        assert!(pieces.iter().all(|p| !p.0 && p.2 == *values), "{name}: {i} stays whole");
                        continue;
                    }
                    assert!(pieces.iter().all(|p| p.0), "{name}: {i} sharded on every rank");
                    sharded_values += values.len();
                    // Ranks whose shard misses the weight hold an empty slice.
                    pieces.retain(|p| !p.1.is_empty());
                    pieces.sort_by_key(|p| p.1.start);
                    let mut next = 0;
                    let mut joined = Vec::new();
                    for (_, range, slice) in pieces {
                        assert_eq!(range.start, next, "{name}: {i}: slices in order, no gap, no overlap");
                        assert_eq!(range.len(), slice.len(), "{name}: {i}");
                        next = range.end;
                        joined.extend_from_slice(slice);
                    }
                    assert_eq!(joined, *values, "{name} over {world}: parameter {i}");
                }
                assert!(sharded_values > 0, "{name} shards some weights");
                let not_held: usize = ranks.iter().map(|(_, n)| n).sum();
                assert_eq!(not_held, (world - 1) * sharded_values, "{name} over {world}");
            }
        }
    }
}

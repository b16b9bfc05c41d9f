//! How a flat vector of `total` values (every trainable value of the model, parameters in
//! visiting order) is split over the ranks for ZeRO-1, and how gradients are cut into buckets
//! for the all-reduce. Both are pure functions of the sizes, so every rank computes the same
//! plan without talking to the others.

use std::ops::Range;

/// Values per rank: `ceil(total / world)`. Every rank's slice is padded to this length on the
/// wire, because all-gathers (NCCL's included) move equal counts from every rank.
pub fn shard_len(total: usize, world: usize) -> usize {
    total.div_ceil(world.max(1))
}

/// The range of the flat vector rank `rank` of `world` owns: consecutive slices of
/// [`shard_len`] values; the last ones may be shorter or empty.
pub fn shard_range(total: usize, world: usize, rank: usize) -> Range<usize> {
    let len = shard_len(total, world);
    let start = (rank * len).min(total);
    start..(start + len).min(total)
}

/// The part of the parameter spanning `param` of the flat vector that lies in `shard`, as a
/// range inside the parameter (`None` when they do not overlap).
pub fn overlap(param: Range<usize>, shard: &Range<usize>) -> Option<Range<usize>> {
    let start = param.start.max(shard.start);
    let end = param.end.min(shard.end);
    (start < end).then(|| start - param.start..end - param.start)
}

/// Gradient buckets over parameters of `lens` values (visiting order), as ranges of the flat
/// gradient vector: from the last parameter backwards (the order backward finishes them), each
/// bucket closed once it holds at least `bucket_values` values, so a parameter is never split
/// and one larger than a bucket is a bucket of its own. Together they cover the vector once.
pub fn bucket_ranges(lens: &[usize], bucket_values: usize) -> Vec<Range<usize>> {
    let total: usize = lens.iter().sum();
    let mut buckets = Vec::new();
    let mut end = total;
    let mut start = total;
    for &len in lens.iter().rev() {
        start -= len;
        if end - start >= bucket_values.max(1) {
            buckets.push(start..end);
            end = start;
        }
    }
    if end > 0 {
        buckets.push(0..end);
    }
    buckets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_the_vector_once_in_rank_order() {
        for total in [0usize, 1, 7, 8, 9, 1000] {
            for world in 1..=5 {
                let ranges: Vec<_> = (0..world).map(|r| shard_range(total, world, r)).collect();
                let mut next = 0;
                for r in &ranges {
                    assert_eq!(r.start, next, "total {total} world {world}");
                    assert!(r.len() <= shard_len(total, world));
                    next = r.end;
                }
                assert_eq!(next, total);
            }
        }
        assert_eq!(shard_range(10, 4, 3), 9..10);
        assert_eq!(shard_range(2, 4, 3), 2..2, "more ranks than values: empty shards");
    }

    #[test]
    fn overlaps_are_ranges_inside_the_parameter() {
        assert_eq!(overlap(10..20, &(15..30)), Some(5..10));
        assert_eq!(overlap(10..20, &(0..12)), Some(0..2));
        assert_eq!(overlap(10..20, &(20..30)), None);
        assert_eq!(overlap(10..20, &(0..100)), Some(0..10));
    }

    #[test]
    fn buckets_run_backwards_and_never_split_a_parameter() {
        // Parameters of 4, 1, 6, 2 values (flat offsets 0, 4, 5, 11, 13), buckets of >= 5 values.
        let b = bucket_ranges(&[4, 1, 6, 2], 5);
        assert_eq!(b, vec![5..13, 0..5]);
        let b = bucket_ranges(&[4, 1, 6, 2], 1);
        assert_eq!(b, vec![11..13, 5..11, 4..5, 0..4], "one parameter a bucket");
        assert_eq!(bucket_ranges(&[4, 1, 6, 2], 1000), vec![0..13], "one bucket");
        assert_eq!(bucket_ranges(&[], 8), Vec::<Range<usize>>::new());
    }
}

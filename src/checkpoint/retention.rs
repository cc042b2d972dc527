//! Which checkpoints to delete: a pure policy, applied only after a new checkpoint is complete.

/// Steps to delete from `steps` (complete checkpoints): keep the newest `keep_last`, and every
/// step that is a multiple of `keep_every` (when non-zero).
pub fn to_delete(steps: &[u64], keep_last: usize, keep_every: u64) -> Vec<u64> {
    let mut sorted = steps.to_vec();
    sorted.sort_unstable();
    let newest = sorted.len().saturating_sub(keep_last.max(1));
    sorted[..newest]
        .iter()
        .copied()
        .filter(|s| keep_every == 0 || s % keep_every != 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest() {
        assert_eq!(to_delete(&[10, 20, 30, 40], 3, 0), vec![10]);
        assert_eq!(to_delete(&[40, 10, 30, 20], 2, 0), vec![10, 20]);
        assert!(to_delete(&[10], 3, 0).is_empty());
        assert!(to_delete(&[], 3, 0).is_empty());
    }

    #[test]
    fn keep_every_is_forever() {
        assert_eq!(to_delete(&[10, 20, 30, 40, 50], 1, 20), vec![10, 30]);
        assert_eq!(to_delete(&[5, 10, 15], 1, 0), vec![5, 10]);
    }

    #[test]
    fn keep_last_is_at_least_one() {
        assert_eq!(to_delete(&[1, 2], 0, 0), vec![1]);
    }
}

//! The in-process collective against a plain reference, for several world sizes and odd buffer
//! lengths; and the hang report when a rank never arrives.

use std::time::{Duration, Instant};

use kiln::collective::{Collective, CollectiveError, LocalGroup, ReduceOp};

/// Rank r's test buffer: distinct values per rank and position.
fn buf(rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (rank * 1000 + i) as f32 * 0.5 - 3.0)
        .collect()
}

/// Runs `f` on every rank of a fresh group, returns the results in rank order.
fn on_ranks<T: Send>(world: usize, f: impl Fn(&mut dyn Collective) -> T + Sync) -> Vec<T> {
    let ranks = LocalGroup::ranks(world, Duration::from_secs(30));
    std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .into_iter()
            .map(|mut r| {
                let f = &f;
                s.spawn(move || f(&mut r))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn ops_match_the_reference() {
    for world in [1usize, 2, 3, 5] {
        for len in [1usize, 7, 1001] {
            let reference_sum: Vec<f32> = (0..len)
                .map(|i| (0..world).fold(0.0f32, |a, r| a + buf(r, len)[i]))
                .collect();
            let out = on_ranks(world, |c| {
                let r = c.rank();
                let mut sum = buf(r, len);
                c.all_reduce(&mut sum, ReduceOp::Sum).unwrap();
                let mut mean = buf(r, len);
                c.all_reduce(&mut mean, ReduceOp::Mean).unwrap();
                let mut b = buf(r, len);
                c.broadcast(&mut b, world - 1).unwrap();
                let mut gathered = vec![0.0; len * world];
                c.all_gather(&buf(r, len), &mut gathered).unwrap();
                let send: Vec<f32> = (0..world).flat_map(|_| buf(r, len)).collect();
                let mut scattered = vec![0.0; len];
                c.reduce_scatter(&send, &mut scattered, ReduceOp::Sum)
                    .unwrap();
                let mut red = buf(r, len);
                c.reduce(&mut red, ReduceOp::Sum, 0).unwrap();
                let mut f = vec![r as f64, 1.5];
                c.all_reduce_f64(&mut f, ReduceOp::Sum).unwrap();
                c.barrier().unwrap();
                (sum, mean, b, gathered, scattered, red, f)
            });
            for (r, (sum, mean, b, gathered, scattered, red, f)) in out.into_iter().enumerate() {
                assert_eq!(sum, reference_sum, "world {world} len {len}");
                let m: Vec<f32> = reference_sum.iter().map(|v| v / world as f32).collect();
                assert_eq!(mean, m);
                assert_eq!(b, buf(world - 1, len));
                let g: Vec<f32> = (0..world).flat_map(|q| buf(q, len)).collect();
                assert_eq!(gathered, g);
                assert_eq!(scattered, reference_sum);
                assert_eq!(
                    red,
                    if r == 0 {
                        reference_sum.clone()
                    } else {
                        buf(r, len)
                    }
                );
                assert_eq!(
                    f,
                    vec![(0..world).sum::<usize>() as f64, 1.5 * world as f64]
                );
            }
        }
    }
}

#[test]
fn a_rank_that_never_arrives_is_named_within_the_timeout() {
    let ranks = LocalGroup::ranks(3, Duration::from_millis(300));
    let start = Instant::now();
    let results: Vec<Result<(), CollectiveError>> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .into_iter()
            .map(|mut c| {
                s.spawn(move || {
                    let mut b = vec![1.0f32; 4];
                    c.broadcast(&mut b, 0)?;
                    if c.rank() == 1 {
                        // rank 1 skips the all-reduce and leaves
                        return Ok(());
                    }
                    c.all_reduce(&mut b, ReduceOp::Sum)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(start.elapsed() < Duration::from_secs(5));
    let err = results[0].as_ref().unwrap_err();
    assert!(matches!(err, CollectiveError::Timeout { .. }));
    assert_eq!(
        err.to_string(),
        "collective timed out after 0s in all_reduce #1 on rank 0: rank 1 never reached all_reduce #1 (last seen: broadcast #0)\n  = help: a rank is stuck or crashed (see logs/rank-<r>.log); raise `strategy.timeout_secs` if it is only slow"
    );
    assert!(results[2].is_err());
}

#[test]
fn mismatched_ops_are_reported() {
    let out = on_ranks(2, |c| {
        let mut b = vec![0.0f32; 3];
        if c.rank() == 0 {
            c.all_reduce(&mut b, ReduceOp::Sum)
        } else {
            c.broadcast(&mut b, 0)
        }
        .inspect_err(|_| c.abort("mismatch"))
    });
    let msgs: Vec<String> = out
        .into_iter()
        .filter_map(|r| r.err())
        .map(|e| e.to_string())
        .collect();
    assert!(
        msgs.iter().any(|m| m.contains("collective mismatch")
            && m.contains("all_reduce #0")
            && m.contains("broadcast #0")),
        "{msgs:?}"
    );
}

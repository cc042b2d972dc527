//! All-reduce bandwidth of the in-process collective (world 2) next to plain memcpy, for a 2 MB
//! and a 64 MB buffer. `cargo bench --bench collective`. Prints GB/s of buffer bytes reduced.

use std::time::{Duration, Instant};

use kiln::collective::{Collective, LocalGroup, ReduceOp};

fn all_reduce_gbps(world: usize, bytes: usize, iters: usize) -> f64 {
    let len = bytes / 4;
    let ranks = LocalGroup::ranks(world, Duration::from_secs(60));
    let start = Instant::now();
    std::thread::scope(|s| {
        for mut r in ranks {
            s.spawn(move || {
                let mut buf = vec![1.0f32; len];
                for _ in 0..iters {
                    r.all_reduce(&mut buf, ReduceOp::Mean).expect("all_reduce");
                }
            });
        }
    });
    (bytes * iters) as f64 / start.elapsed().as_secs_f64() / 1e9
}

fn memcpy_gbps(bytes: usize, iters: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    let start = Instant::now();
    for i in 0..iters {
        dst.copy_from_slice(&src);
        std::hint::black_box(&mut dst);
        std::hint::black_box(i);
    }
    (bytes * iters) as f64 / start.elapsed().as_secs_f64() / 1e9
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    println!("buffer   all_reduce(world 2) GB/s   memcpy GB/s   (median of 3)");
    for (name, bytes, iters) in [("2 MB", 2 << 20, 200), ("64 MB", 64 << 20, 8)] {
        let ar = median((0..3).map(|_| all_reduce_gbps(2, bytes, iters)).collect());
        let mc = median((0..3).map(|_| memcpy_gbps(bytes, iters)).collect());
        println!("{name:<8} {ar:>26.2}   {mc:>11.2}");
    }
}

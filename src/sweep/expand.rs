//! Trials of a sweep: the cartesian product of `grid`, combined with `random` samples drawn
//! deterministically from the seed.

use crate::config::{Distribution, SweepConfig};
use crate::rng::Rng;

/// One trial: its position and its overrides (dotted key, value), in key order.
#[derive(Debug, Clone, PartialEq)]
pub struct Trial {
    pub index: usize,
    pub overrides: Vec<(String, toml::Value)>,
}

impl Trial {
    /// The overrides as `--set` arguments.
    pub fn set_args(&self) -> Vec<String> {
        self.overrides
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect()
    }

    /// `key=value, key=value` for tables and logs.
    pub fn describe(&self) -> String {
        if self.overrides.is_empty() {
            return "(base config)".into();
        }
        self.overrides
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ExpandError {
    #[error("the sweep has no trials\n  = help: add `[sweep] grid = {{ \"optim.lr\" = [1e-3, 1e-2] }}` or `[sweep] random = {{ samples = 8, space = {{ ... }} }}`")]
    Empty,
    #[error("`sweep.grid.\"{0}\"` has no values\n  = help: list at least one value")]
    EmptyAxis(String),
    #[error("the sweep has more than {0} trials\n  = help: search fewer values per key (or fewer random samples)")]
    TooMany(usize),
    #[error("`sweep.random.space.\"{key}\"`: {why}")]
    BadDistribution { key: String, why: String },
}

fn sample(d: &Distribution, key: &str, rng: &mut Rng) -> Result<toml::Value, ExpandError> {
    let bad = |why: &str| ExpandError::BadDistribution {
        key: key.to_string(),
        why: why.to_string(),
    };
    Ok(match d {
        Distribution::LogUniform([lo, hi]) => {
            if !(*lo > 0.0 && hi > lo) {
                return Err(bad("log_uniform needs 0 < low < high"));
            }
            toml::Value::Float(rng.uniform(lo.ln(), hi.ln()).exp())
        }
        Distribution::Uniform([lo, hi]) => {
            if hi < lo {
                return Err(bad("uniform needs low <= high"));
            }
            toml::Value::Float(rng.uniform(*lo, *hi))
        }
        Distribution::Choice(values) => {
            if values.is_empty() {
                return Err(bad("choice needs at least one value"));
            }
            values[rng.below(values.len() as u64) as usize].clone()
        }
    })
}

/// Every trial of the sweep, in a stable order.
pub fn expand(s: &SweepConfig) -> Result<Vec<Trial>, ExpandError> {
    if s.grid.is_empty() && s.random.is_none() {
        return Err(ExpandError::Empty);
    }
    // counted before anything is allocated: a grid of 6 keys x 10 values, or a billion random
    // samples, is refused here rather than by the memory it would take
    let max = crate::config::MAX_TRIALS;
    let count = s
        .grid
        .values()
        .try_fold(1usize, |a, v| a.checked_mul(v.len().max(1)))
        .and_then(|g| g.checked_mul(s.random.as_ref().map_or(1, |r| r.samples.max(1))));
    if count.is_none_or(|n| n > max) {
        return Err(ExpandError::TooMany(max));
    }
    let mut points: Vec<Vec<(String, toml::Value)>> = vec![Vec::new()];
    for (key, values) in &s.grid {
        if values.is_empty() {
            return Err(ExpandError::EmptyAxis(key.clone()));
        }
        points = points
            .into_iter()
            .flat_map(|p| {
                values.iter().map(move |v| {
                    let mut q = p.clone();
                    q.push((key.clone(), v.clone()));
                    q
                })
            })
            .collect();
    }
    if let Some(r) = &s.random {
        let mut draws = Vec::with_capacity(r.samples);
        for i in 0..r.samples {
            let mut rng = Rng::stream(r.seed, "sweep-random", &[i as u64]);
            let mut d = Vec::new();
            for (key, dist) in &r.space {
                d.push((key.clone(), sample(dist, key, &mut rng)?));
            }
            draws.push(d);
        }
        points = points
            .into_iter()
            .flat_map(|p| {
                draws.iter().map(move |d| {
                    let mut q = p.clone();
                    q.extend(d.iter().cloned());
                    q
                })
            })
            .collect();
    }
    Ok(points
        .into_iter()
        .enumerate()
        .map(|(index, mut overrides)| {
            overrides.sort_by(|a, b| a.0.cmp(&b.0));
            Trial { index, overrides }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RandomSearch;

    fn grid(pairs: &[(&str, Vec<toml::Value>)]) -> SweepConfig {
        SweepConfig {
            grid: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            ..SweepConfig::default()
        }
    }

    #[test]
    fn grid_is_the_cartesian_product() {
        let s = grid(&[
            (
                "optim.lr",
                vec![toml::Value::Float(0.1), toml::Value::Float(0.2)],
            ),
            (
                "strategy.kind",
                vec!["ddp".into(), "fsdp".into(), "dp".into()],
            ),
        ]);
        let t = expand(&s).unwrap();
        assert_eq!(t.len(), 6);
        assert_eq!(
            t[0].set_args(),
            vec!["optim.lr=0.1", "strategy.kind=\"ddp\""]
        );
        assert_eq!(
            t[5].set_args(),
            vec!["optim.lr=0.2", "strategy.kind=\"dp\""]
        );
        assert_eq!(expand(&SweepConfig::default()), Err(ExpandError::Empty));
    }

    #[test]
    fn random_is_deterministic_per_seed_and_in_range() {
        let mut s = SweepConfig {
            random: Some(RandomSearch {
                samples: 8,
                seed: 3,
                space: [
                    (
                        "optim.lr".to_string(),
                        Distribution::LogUniform([1e-4, 1e-1]),
                    ),
                    (
                        "train.batch_size".to_string(),
                        Distribution::Choice(vec![16.into(), 32.into()]),
                    ),
                ]
                .into_iter()
                .collect(),
            }),
            ..Default::default()
        };
        let a = expand(&s).unwrap();
        assert_eq!(a, expand(&s).unwrap());
        assert_eq!(a.len(), 8);
        for t in &a {
            let lr = t.overrides[0].1.as_float().unwrap();
            assert!((1e-4..1e-1).contains(&lr), "{lr}");
        }
        let firsts: Vec<f64> = a
            .iter()
            .map(|t| t.overrides[0].1.as_float().unwrap())
            .collect();
        if let Some(r) = &mut s.random {
            r.seed = 4;
        }
        let b: Vec<f64> = expand(&s)
            .unwrap()
            .iter()
            .map(|t| t.overrides[0].1.as_float().unwrap())
            .collect();
        assert_ne!(firsts, b);
        // grid x random
        s.grid.insert(
            "optim.momentum".into(),
            vec![toml::Value::Float(0.0), toml::Value::Float(0.9)],
        );
        assert_eq!(expand(&s).unwrap().len(), 16);
    }
}

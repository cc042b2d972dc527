//! `[profile]`: Chrome traces of chosen steps.

use serde::{Deserialize, Serialize};

use super::error::ConfigError;
use super::load::Resolved;
use super::validate::*;
#[allow(unused_imports)]
use super::*;

/// `[profile]`: Chrome traces of chosen steps (torch.profiler's schedule): skip `wait` steps,
/// `warmup` steps more, record `active` steps; `repeat` such cycles (0: until the end).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProfileConfig {
    /// Write `trace/rank-<r>.json` and `trace/all.json`. Default: `false`.
    pub enabled: bool,
    /// Steps skipped at the start of each cycle. Default: `1`.
    pub wait: usize,
    /// Steps run (not recorded) before the recorded ones. Default: `1`.
    pub warmup: usize,
    /// Steps recorded per cycle (at least 1). Default: `3`.
    pub active: usize,
    /// Cycles; 0 repeats until training ends. Default: `1`.
    pub repeat: usize,
    /// Ranks traced; empty means every rank. Default: `[]`.
    pub ranks: Vec<usize>,
}

impl Default for ProfileConfig {
    fn default() -> Self {
        ProfileConfig {
            enabled: false,
            wait: 1,
            warmup: 1,
            active: 3,
            repeat: 1,
            ranks: Vec::new(),
        }
    }
}

impl ProfileConfig {
    /// Whether step `i` of this session (0-based) is recorded.
    pub fn records(&self, i: usize) -> bool {
        let cycle = self.wait + self.warmup + self.active.max(1);
        if !self.enabled || (self.repeat > 0 && i >= self.repeat * cycle) {
            return false;
        }
        i % cycle >= self.wait + self.warmup
    }
    /// Whether `rank` is traced.
    pub fn traces(&self, rank: usize) -> bool {
        self.enabled && (self.ranks.is_empty() || self.ranks.contains(&rank))
    }
}

impl ProfileConfig {
    /// `profile.active`.
    pub(super) fn check(&self, r: &Resolved) -> Result<(), ConfigError> {
        at_least(r, "profile.active", self.active, 1)?;
        Ok(())
    }
}

//! The files of a checkpoint: little-endian f32 buffers with a magic header, the optimizer state,
//! `state.json` and `MANIFEST.json`.

use serde::{Deserialize, Serialize};

const F32_MAGIC: &[u8; 8] = b"KILNF32\0";
const OPT_MAGIC: &[u8; 8] = b"KILNOPT\0";

/// Optimizer state of a whole model or of one rank's shards.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OptState {
    pub steps: u64,
    pub m: Vec<f32>,
    pub v: Vec<f32>,
}

pub fn encode_f32(v: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + v.len() * 4);
    out.extend_from_slice(F32_MAGIC);
    out.extend_from_slice(&(v.len() as u64).to_le_bytes());
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

fn read_u64(b: &[u8], at: usize) -> Option<u64> {
    b.get(at..at + 8)
        .map(|s| u64::from_le_bytes(s.try_into().unwrap_or([0; 8])))
}

fn read_f32s(b: &[u8], at: usize, n: usize) -> Option<Vec<f32>> {
    let bytes = b.get(at..at.checked_add(n.checked_mul(4)?)?)?;
    Some(
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    )
}

pub fn decode_f32(b: &[u8]) -> Result<Vec<f32>, String> {
    if b.get(..8) != Some(F32_MAGIC.as_slice()) {
        return Err("not a kiln f32 buffer (bad magic)".into());
    }
    let n = read_u64(b, 8).ok_or("truncated header")? as usize;
    if b.len() != 16 + n * 4 {
        return Err(format!(
            "expected {} bytes for {n} values, found {}",
            16 + n * 4,
            b.len()
        ));
    }
    read_f32s(b, 16, n).ok_or_else(|| "truncated data".into())
}

pub fn encode_opt(o: &OptState) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + (o.m.len() + o.v.len()) * 4);
    out.extend_from_slice(OPT_MAGIC);
    out.extend_from_slice(&o.steps.to_le_bytes());
    out.extend_from_slice(&(o.m.len() as u64).to_le_bytes());
    out.extend_from_slice(&(o.v.len() as u64).to_le_bytes());
    for x in o.m.iter().chain(&o.v) {
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

pub fn decode_opt(b: &[u8]) -> Result<OptState, String> {
    if b.get(..8) != Some(OPT_MAGIC.as_slice()) {
        return Err("not a kiln optimizer file (bad magic)".into());
    }
    let steps = read_u64(b, 8).ok_or("truncated header")?;
    let nm = read_u64(b, 16).ok_or("truncated header")? as usize;
    let nv = read_u64(b, 24).ok_or("truncated header")? as usize;
    if b.len() != 32 + (nm + nv) * 4 {
        return Err(format!(
            "expected {} bytes, found {}",
            32 + (nm + nv) * 4,
            b.len()
        ));
    }
    Ok(OptState {
        steps,
        m: read_f32s(b, 32, nm).ok_or("truncated data")?,
        v: read_f32s(b, 32 + nm * 4, nv).ok_or("truncated data")?,
    })
}

/// How the parameters and optimizer state are laid out in the files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "layout", rename_all = "lowercase")]
pub enum Layout {
    /// `model.bin` and `optim.bin` hold the whole model (written by rank 0).
    Full,
    /// `model-rank-<r>.bin` and `optim-rank-<r>.bin` hold rank r's shard of every unit, each
    /// padded to `shard_len`; units are (start, len, shard_len) in the flat parameter buffer.
    Sharded {
        world: usize,
        units: Vec<[usize; 3]>,
    },
}

/// Where the data stream stands, by a global cursor that any world size can continue from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataPosition {
    pub epoch: u64,
    /// Samples of the epoch's order consumed, over all ranks.
    pub cursor: usize,
    /// Where the current pass over the epoch started (non-zero after resuming mid-epoch).
    pub segment_start: usize,
    /// Micro-batches taken since `segment_start` (per rank).
    pub segment_micro: usize,
}

/// `state.json`: everything besides tensors that resume needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct State {
    pub step: usize,
    pub position: DataPosition,
    /// Micro-steps into the current accumulation (checkpoints are taken at step boundaries).
    pub accum_position: usize,
    /// Every draw is derived from these seeds and the counters above (see `rng.rs`), so they are
    /// the whole RNG state: init (experiment.seed), dropout (experiment.seed, step, micro-step,
    /// rank), shuffling (sampler.seed + epoch), synthetic data (data.seed).
    pub rng: RngState,
    pub world_size: usize,
    pub strategy: String,
    pub micro_batch: usize,
    pub grad_accum_steps: usize,
    pub num_params: usize,
    pub params: Layout,
    pub optimizer: OptimizerInfo,
    pub scheduler: SchedulerInfo,
    pub last_loss: f64,
    pub config_hash: String,
    pub kiln_version: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RngState {
    pub init_seed: u64,
    pub dropout_seed: u64,
    pub sampler_seed: u64,
    pub data_seed: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OptimizerInfo {
    pub kind: String,
    pub steps: u64,
}

/// The LR schedule is a pure function of the step; this records where it stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchedulerInfo {
    pub kind: String,
    pub last_step: usize,
    pub last_lr: f64,
}

/// `MANIFEST.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub files: Vec<ManifestEntry>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ManifestEntry {
    pub name: String,
    pub size: u64,
    pub sha256: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_damage() {
        let v = vec![1.5f32, -2.0, 3.25];
        assert_eq!(decode_f32(&encode_f32(&v)).unwrap(), v);
        let mut bad = encode_f32(&v);
        bad.pop();
        assert!(decode_f32(&bad).is_err());
        let o = OptState {
            steps: 7,
            m: vec![1.0, 2.0],
            v: vec![3.0, 4.0],
        };
        assert_eq!(decode_opt(&encode_opt(&o)).unwrap(), o);
        assert!(decode_opt(&encode_f32(&v)).is_err());
    }
}

//! The flat parameter layout: every trainable parameter's module path, shape and offset in one
//! flat buffer, and the model's units (consecutive groups of parameters that fsdp gathers and
//! shards together with `unit = "layer"`).

use std::ops::Range;

/// One parameter tensor inside the flat buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamSpec {
    /// The module path, e.g. `layers.0.weight`.
    pub name: String,
    pub shape: Vec<usize>,
    pub offset: usize,
    /// The Burn module type that holds it (`Linear`, `LayerNorm`, `Conv2d`, ...), or empty when
    /// unknown; it decides how the parameter is named and laid out in PyTorch.
    pub module: String,
}

impl ParamSpec {
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.len()
    }
}

/// A group of consecutive parameters that is gathered as one (a layer, a block).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitSpec {
    /// The common path prefix, e.g. `layers.0`.
    pub name: String,
    /// Indices into `ParamLayout::params`.
    pub params: Range<usize>,
    /// The flat range it covers.
    pub range: Range<usize>,
}

/// Every trainable parameter of a model, in a deterministic order, contiguous in one buffer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParamLayout {
    pub params: Vec<ParamSpec>,
    pub units: Vec<UnitSpec>,
    /// Flat elements at the head of the buffer that never train (`model.freeze`, LoRA's base
    /// weights): the parameters `frozen` made first, so that the trainable ones are one
    /// contiguous tail, `trainable()`, and no unit mixes the two. Gradients, their reductions
    /// and the optimizer state cover the tail only. 0: everything trains.
    pub frozen: usize,
}

impl ParamLayout {
    /// The flat ranges of the parameters weight decay spares under `rule` (`matrices`: those
    /// of fewer than two dimensions), merged, in order.
    pub fn no_decay(&self, rule: crate::config::DecayRule) -> Vec<std::ops::Range<usize>> {
        let mut out: Vec<std::ops::Range<usize>> = Vec::new();
        if rule == crate::config::DecayRule::All {
            return out;
        }
        for p in self.params.iter().filter(|p| p.shape.len() < 2) {
            let r = p.range();
            match out.last_mut() {
                Some(last) if last.end == r.start => last.end = r.end,
                _ => out.push(r),
            }
        }
        out
    }

    /// The layout of `(path, shape)` pairs in this order. Units are the runs of consecutive
    /// parameters that share `unit_of(path)`.
    pub fn new(entries: Vec<(String, Vec<usize>)>) -> Self {
        Self::with_modules(
            entries
                .into_iter()
                .map(|(name, shape)| (name, shape, String::new()))
                .collect(),
        )
    }

    /// `new`, with the module type holding each parameter.
    pub fn with_modules(entries: Vec<(String, Vec<usize>, String)>) -> Self {
        let mut params = Vec::with_capacity(entries.len());
        let mut offset = 0;
        for (name, shape, module) in entries {
            let spec = ParamSpec {
                name,
                shape,
                offset,
                module,
            };
            offset += spec.len();
            params.push(spec);
        }
        let mut units: Vec<UnitSpec> = Vec::new();
        for (i, p) in params.iter().enumerate() {
            let name = unit_of(&p.name);
            match units.last_mut() {
                Some(u) if u.name == name => {
                    u.params.end = i + 1;
                    u.range.end = p.range().end;
                }
                _ => units.push(UnitSpec {
                    name: name.to_string(),
                    params: i..i + 1,
                    range: p.range(),
                }),
            }
        }
        ParamLayout {
            params,
            units,
            frozen: 0,
        }
    }

    /// This layout with the parameters `freeze` picks (by index) moved to the head of the
    /// buffer, each group in its own order: a unit with both becomes two units of the same
    /// name, its frozen part first. `None` when nothing is picked (the layout is unchanged).
    pub fn frozen_first(&self, freeze: &[bool]) -> Option<ParamLayout> {
        if !freeze.iter().any(|&f| f) {
            return None;
        }
        let pick = |want: bool| {
            self.params
                .iter()
                .zip(freeze)
                .filter(move |(_, &f)| f == want)
                .map(|(p, _)| (p.name.clone(), p.shape.clone(), p.module.clone()))
        };
        let frozen: Vec<_> = pick(true).collect();
        let n_frozen: usize = frozen
            .iter()
            .map(|(_, s, _)| s.iter().product::<usize>())
            .sum();
        let count = frozen.len();
        let mut out = Self::with_modules(frozen.into_iter().chain(pick(false)).collect());
        // units never straddle the boundary, even where a name continues across it
        let mut units = Vec::with_capacity(out.units.len() + 1);
        for u in out.units.drain(..) {
            if u.params.start < count && u.params.end > count {
                let at = out.params[count].offset;
                units.push(UnitSpec {
                    name: u.name.clone(),
                    params: u.params.start..count,
                    range: u.range.start..at,
                });
                units.push(UnitSpec {
                    name: u.name,
                    params: count..u.params.end,
                    range: at..u.range.end,
                });
            } else {
                units.push(u);
            }
        }
        out.units = units;
        out.frozen = n_frozen;
        Some(out)
    }

    /// The flat range of the parameters that train (everything after `frozen`).
    pub fn trainable(&self) -> Range<usize> {
        self.frozen..self.num_params()
    }

    /// Whether unit `u` is frozen (all of its parameters: units never mix).
    pub fn unit_frozen(&self, u: usize) -> bool {
        self.units[u].range.start < self.frozen
    }

    /// Elements that train.
    pub fn num_trainable(&self) -> usize {
        self.num_params() - self.frozen
    }

    /// Elements in the flat buffer.
    pub fn num_params(&self) -> usize {
        self.params.last().map(|p| p.range().end).unwrap_or(0)
    }

    pub fn num_units(&self) -> usize {
        self.units.len()
    }

    /// The flat range of unit `u`.
    pub fn unit_range(&self, u: usize) -> Range<usize> {
        self.units[u].range.clone()
    }

    /// Every parameter's (name, shape), in flat order.
    pub fn specs(&self) -> Vec<(String, Vec<usize>)> {
        self.params
            .iter()
            .map(|p| (p.name.clone(), p.shape.clone()))
            .collect()
    }

    /// The unit that parameter `i` belongs to.
    pub fn unit_of_param(&self, i: usize) -> usize {
        self.units
            .iter()
            .position(|u| u.params.contains(&i))
            .unwrap_or(0)
    }
}

/// The unit a parameter path belongs to: the path up to and including its first list index
/// (`layers.0.weight` -> `layers.0`, `blocks.3.attn.qkv.weight` -> `blocks.3`), else its first
/// component (`wte.weight` -> `wte`).
pub fn unit_of(path: &str) -> &str {
    let mut end = 0;
    for (i, part) in path.split('.').enumerate() {
        end += part.len() + usize::from(i > 0);
        if part.parse::<usize>().is_ok() {
            return &path[..end];
        }
    }
    path.split('.').next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_follow_list_items_and_top_level_fields() {
        assert_eq!(unit_of("layers.0.weight"), "layers.0");
        assert_eq!(unit_of("blocks.12.attn.qkv.bias"), "blocks.12");
        assert_eq!(unit_of("wte.weight"), "wte");
        assert_eq!(unit_of("scale"), "scale");
        let l = ParamLayout::new(vec![
            ("wte.weight".into(), vec![4, 2]),
            ("blocks.0.a".into(), vec![3]),
            ("blocks.0.b".into(), vec![2, 2]),
            ("blocks.1.a".into(), vec![3]),
            ("ln_f.gamma".into(), vec![2]),
        ]);
        assert_eq!(l.num_params(), 8 + 3 + 4 + 3 + 2);
        let names: Vec<_> = l.units.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(names, ["wte", "blocks.0", "blocks.1", "ln_f"]);
        assert_eq!(l.unit_range(1), 8..15);
        assert_eq!(l.unit_of_param(2), 1);
        assert_eq!(l.params[3].offset, 15);
        assert_eq!((l.frozen, l.trainable()), (0, 0..20));
    }

    #[test]
    fn frozen_parameters_lead_and_no_unit_mixes_them() {
        let l = ParamLayout::new(vec![
            ("wte.weight".into(), vec![4, 2]),
            ("blocks.0.a".into(), vec![3]),
            ("blocks.0.b".into(), vec![2, 2]),
            ("blocks.1.a".into(), vec![3]),
        ]);
        assert!(l.frozen_first(&[false; 4]).is_none());
        let f = l.frozen_first(&[true, false, true, false]).unwrap();
        let names: Vec<_> = f.params.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            ["wte.weight", "blocks.0.b", "blocks.0.a", "blocks.1.a"]
        );
        assert_eq!(f.frozen, 12);
        assert_eq!(f.trainable(), 12..18);
        let units: Vec<_> = f
            .units
            .iter()
            .map(|u| (u.name.as_str(), u.range.clone()))
            .collect();
        assert_eq!(
            units,
            [
                ("wte", 0..8),
                ("blocks.0", 8..12),
                ("blocks.0", 12..15),
                ("blocks.1", 15..18)
            ]
        );
        let frozen: Vec<_> = (0..4).map(|u| f.unit_frozen(u)).collect();
        assert_eq!(frozen, [true, true, false, false]);
    }
}

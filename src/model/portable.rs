//! A model's weights under names and layouts other tools read: PyTorch's (`state_dict` names of
//! the module the family mirrors; Linear weights `[out, in]`; a norm's `weight`/`bias`) or
//! Burn's own (module paths; Linear weights `[in, out]`; a norm's `gamma`/`beta`, as Burn's
//! `SafetensorsStore` writes them). The module-type rules are those of burn-store's
//! `BurnToPyTorchAdapter`; the family maps the module paths (`WeightAdapter::torch_name`).

use std::collections::{HashMap, HashSet};
use std::fmt;

use crate::config::edit_distance;
use crate::params::ParamSpec;

use super::api::Model;

/// How exported weights are named and laid out: PyTorch's or Burn's names, which every family
/// has, or one of a family's own formats (`WeightAdapter::formats`), which the family defines in its
/// own files (the gpt's `hf-gpt2` and `nanogpt` in `model/gpt/hf.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightFormat {
    PyTorch,
    Burn,
    Family(FamilyFormat),
}

/// A format a family defines (`WeightAdapter::formats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FamilyFormat {
    /// Its name in `--format`, `model.init_format` and an export's `kiln.format` metadata.
    pub name: &'static str,
    /// An export is a directory: `model.safetensors` beside the `config.json` of
    /// `WeightAdapter::hf_config` (Hugging Face's `from_pretrained` layout), not one file.
    pub dir: bool,
    /// How its files' names read as kiln's: a name that begins with a pair's first part is read
    /// with the second in its place (nanoGPT's `_orig_mod.` of `torch.compile` taken off; a
    /// Gemma 3 vision-language checkpoint's `language_model.model.` or, as transformers 5
    /// saves it with `save_original_format=False`, `model.language_model.`, read as `model.`).
    /// The first pair that matches is taken.
    pub renames: &'static [(&'static str, &'static str)],
}

impl WeightFormat {
    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::PyTorch => "pytorch",
            WeightFormat::Burn => "burn",
            WeightFormat::Family(f) => f.name,
        }
    }

    /// Its export is a directory (`FamilyFormat::dir`).
    pub fn is_dir(self) -> bool {
        matches!(self, WeightFormat::Family(f) if f.dir)
    }

    /// Tensor name `n` of a file in this format as kiln reads it (`FamilyFormat::renames`).
    pub fn strip(self, n: &str) -> std::borrow::Cow<'_, str> {
        let WeightFormat::Family(f) = self else {
            return n.into();
        };
        f.renames
            .iter()
            .find_map(|(theirs, ours)| {
                let rest = n.strip_prefix(theirs)?;
                Some(if ours.is_empty() {
                    rest.into()
                } else {
                    format!("{ours}{rest}").into()
                })
            })
            .unwrap_or(n.into())
    }
}

/// The formats `model` reads and writes: PyTorch's and Burn's names, which every family has,
/// then its family's own (`WeightAdapter::formats`).
pub fn formats_of(model: &dyn Model) -> Vec<WeightFormat> {
    let mut all = vec![WeightFormat::PyTorch, WeightFormat::Burn];
    all.extend(model.weights().formats());
    // (a model with LoRA adapters writes them as PEFT does)
    if model.weights().lora().is_some() {
        all.push(crate::model::lora::PEFT);
    }
    all
}

/// `formats_of(model)` by name, for messages: "pytorch, burn, hf-gpt2, nanogpt".
pub fn format_names(model: &dyn Model) -> String {
    let names: Vec<&str> = formats_of(model).iter().map(|f| f.name()).collect();
    names.join(", ")
}

/// The format of `model` called `name`, or why there is none: "model `mlp` has no nanogpt
/// names (it has pytorch, burn)", with the closest name when one is near.
pub fn format_named(model: &dyn Model, name: &str) -> Result<WeightFormat, String> {
    let all = formats_of(model);
    if let Some(f) = all.iter().find(|f| f.name() == name) {
        return Ok(*f);
    }
    // `hf`: the Hugging Face directory of the model's own architecture
    if name == "hf" {
        if let Some(f) = model.weights().formats().into_iter().find(|f| f.is_dir()) {
            return Ok(f);
        }
    }
    let names: Vec<&str> = all.iter().map(|f| f.name()).collect();
    let near = crate::config::closest(name, &names)
        .map(|c| format!("; did you mean \"{c}\"?"))
        .unwrap_or_default();
    Err(format!(
        "model `{}` has no {} names (it has {}){near}",
        model.kind(),
        crate::config::brief(name, 60),
        format_names(model)
    ))
}

/// One tensor of the exported weights and the parameter it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct External {
    pub name: String,
    pub shape: Vec<usize>,
    /// Index into the layout's parameters.
    pub param: usize,
    /// Stored transposed (a Linear weight in PyTorch's `[out, in]`).
    pub transpose: bool,
    /// A copy of another tensor (a tied weight): written by an export, optional on import.
    pub alias: bool,
}

impl External {
    /// Parameter `param` (`p` of the layout) stored under `name`, transposed or not (a
    /// transposed matrix's shape is swapped), not an alias.
    pub fn stored(name: String, p: &ParamSpec, param: usize, transpose: bool) -> External {
        External {
            name,
            shape: if transpose {
                vec![p.shape[1], p.shape[0]]
            } else {
                p.shape.clone()
            },
            param,
            transpose,
            alias: false,
        }
    }
}

/// Adds `alias` as a tied copy of tensor `source` to `out` (written by an export, optional on
/// import), unless `out` has a tensor of that name already (an untied output layer).
pub fn tie_alias(out: &mut Vec<External>, source: &str, alias: &str) {
    if out.iter().any(|e| e.name == alias) {
        return;
    }
    if let Some(src) = out.iter().find(|e| e.name == source).cloned() {
        out.push(External {
            name: alias.to_string(),
            alias: true,
            ..src
        });
    }
}

/// `path` with the list index after `list` renumbered: `renumber("layers.2.bias", "layers",
/// |i| 2 * i)` is `4.bias`. Other paths are returned as they are.
pub fn renumber(path: &str, list: &str, f: impl Fn(usize) -> usize) -> String {
    let Some(rest) = path.strip_prefix(list).and_then(|r| r.strip_prefix('.')) else {
        return path.to_string();
    };
    let (index, tail) = rest.split_once('.').unwrap_or((rest, ""));
    match index.parse::<usize>() {
        Ok(i) if tail.is_empty() => f(i).to_string(),
        Ok(i) => format!("{}.{tail}", f(i)),
        Err(_) => path.to_string(),
    }
}

/// Burn's normalisation modules, whose `gamma`/`beta` PyTorch calls `weight`/`bias`.
const NORMS: [&str; 5] = [
    "BatchNorm",
    "LayerNorm",
    "GroupNorm",
    "InstanceNorm",
    "RmsNorm",
];

fn torch_external(model: &dyn Model, i: usize, p: &ParamSpec) -> External {
    let (prefix, leaf) = p.name.rsplit_once('.').unwrap_or(("", &p.name));
    let leaf = match leaf {
        "gamma" if NORMS.contains(&p.module.as_str()) => "weight",
        "beta" if NORMS.contains(&p.module.as_str()) => "bias",
        other => other,
    };
    let transpose = p.module == "Linear" && leaf == "weight" && p.shape.len() == 2;
    let path = if prefix.is_empty() {
        leaf.to_string()
    } else {
        format!("{prefix}.{leaf}")
    };
    External::stored(model.weights().torch_name(&path), p, i, transpose)
}

/// The tensors of `model`'s weights in `format`, in layout order, aliases last.
pub fn externals(model: &dyn Model, format: WeightFormat) -> Vec<External> {
    let layout = model.layout();
    if format == crate::model::lora::PEFT {
        // the adapters under the family's Hugging Face names (PyTorch's without one), prefixed
        let base = model
            .weights()
            .formats()
            .into_iter()
            .find(|f| f.is_dir())
            .unwrap_or(WeightFormat::PyTorch);
        return externals(model, base)
            .into_iter()
            .filter(|e| !e.alias && crate::model::lora::is_adapter(&layout.params[e.param].name))
            .map(|e| External {
                name: format!("base_model.model.{}", e.name),
                ..e
            })
            .collect();
    }
    if model.weights().formats().contains(&format) {
        let torch: Vec<External> = layout
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| torch_external(model, i, p))
            .collect();
        return model
            .weights()
            .format_tensors(format, model.layout(), &torch);
    }
    let mut out: Vec<External> = match format {
        WeightFormat::Burn => layout
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| External {
                name: p.name.clone(),
                shape: p.shape.clone(),
                param: i,
                transpose: false,
                alias: false,
            })
            .collect(),
        _ => layout
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| torch_external(model, i, p))
            .collect(),
    };
    if format == WeightFormat::PyTorch {
        for (alias, source) in model.weights().torch_aliases() {
            if let Some(src) = out.iter().find(|e| e.name == source && !e.alias).cloned() {
                out.push(External {
                    name: alias,
                    alias: true,
                    ..src
                });
            }
        }
    }
    out
}

fn transpose(data: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; data.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = data[r * cols + c];
        }
    }
    out
}

/// The flat parameters `flat` as named tensors `(name, shape, values)` in `format`. A Hugging
/// Face format (a directory's) of a model with LoRA adapters gets the merged weights, as PEFT's
/// `merge_and_unload` makes them (`merged`), and no adapter tensor.
pub fn export(
    model: &dyn Model,
    format: WeightFormat,
    flat: &[f32],
) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let layout = model.layout();
    let merged;
    let (flat, skip) = match model.weights().lora() {
        Some(spec) if format.is_dir() && format != crate::model::lora::PEFT => {
            merged = merge(model, spec.scale(), flat);
            (merged.as_slice(), true)
        }
        _ => (flat, false),
    };
    externals(model, format)
        .into_iter()
        .filter(|e| !(skip && crate::model::lora::is_adapter(&layout.params[e.param].name)))
        .map(|e| {
            let p = &layout.params[e.param];
            let values = &flat[p.range()];
            let data = if e.transpose {
                transpose(values, p.shape[0], p.shape[1])
            } else {
                values.to_vec()
            };
            (e.name, e.shape, data)
        })
        .collect()
}

/// `flat` with each LoRA adapter merged into the weight it adapts: `W += scale * B A` (in
/// Burn's `[in, out]`: `W += scale * A B`), the adapters' own values left as they are. The
/// weight of adapter `X.lora_A.weight` is `X.weight`, by PyTorch's names.
pub fn merge(model: &dyn Model, scale: f64, flat: &[f32]) -> Vec<f32> {
    let layout = model.layout();
    let mut out = flat.to_vec();
    let by_name: HashMap<String, usize> = layout
        .params
        .iter()
        .enumerate()
        .map(|(i, p)| (torch_external(model, i, p).name, i))
        .collect();
    for (name, &ia) in &by_name {
        let Some(stem) = name.strip_suffix(".lora_A.weight") else {
            continue;
        };
        let (Some(&ib), Some(&iw)) = (
            by_name.get(&format!("{stem}.lora_B.weight")),
            by_name.get(&format!("{stem}.weight")),
        ) else {
            continue;
        };
        let (a, b, w) = (&layout.params[ia], &layout.params[ib], &layout.params[iw]);
        let (d_in, r, d_out) = (a.shape[0], a.shape[1], b.shape[1]);
        let (av, bv) = (&flat[a.range()], &flat[b.range()]);
        let wv = &mut out[w.range()];
        for i in 0..d_in {
            let row = &mut wv[i * d_out..(i + 1) * d_out];
            for k in 0..r {
                let s = (scale * f64::from(av[i * r + k])) as f32;
                for (o, x) in row.iter_mut().zip(&bv[k * d_out..(k + 1) * d_out]) {
                    *o += s * x;
                }
            }
        }
    }
    out
}

/// Why a set of named tensors does not fit a model: every problem at once.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Mismatch {
    /// (model tensor, closest name in the file).
    pub missing: Vec<(String, Option<String>)>,
    /// (file tensor, closest name the model expects).
    pub unexpected: Vec<(String, Option<String>)>,
    /// (name, shape in the file, shape the model needs).
    pub shapes: Vec<(String, Vec<usize>, Vec<usize>)>,
    /// Tied copies whose values differ.
    pub differ: Vec<(String, String)>,
    /// (name, dtype) of tensors the model needs that are not of a float type.
    pub dtypes: Vec<(String, String)>,
}

impl Mismatch {
    /// `3 missing, 1 unexpected, 2 wrong shape`: the counts of each kind of problem.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        for (n, what) in [
            (self.missing.len(), "missing"),
            (self.unexpected.len(), "unexpected"),
            (self.shapes.len(), "wrong shape"),
            (self.differ.len(), "tied copies differ"),
            (self.dtypes.len(), "not a float type"),
        ] {
            if n > 0 {
                parts.push(format!("{n} {what}"));
            }
        }
        parts.join(", ")
    }

    pub fn is_empty(&self) -> bool {
        self.missing.is_empty()
            && self.unexpected.is_empty()
            && self.shapes.is_empty()
            && self.differ.is_empty()
            && self.dtypes.is_empty()
    }
}

/// Lines of each kind shown before "... and N more".
const SHOWN: usize = 20;

/// A name as shown in a message: long ones are cut.
fn shown(name: &str) -> String {
    const MAX: usize = 120;
    match name.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}... ({} bytes)", &name[..i], name.len()),
        None => name.to_string(),
    }
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let closest = |c: &Option<String>, side: &str| match c {
            Some(c) => format!(" (closest {side}: `{}`)", shown(c)),
            None => String::new(),
        };
        let more = |f: &mut fmt::Formatter<'_>, n: usize, what: &str| {
            if n > SHOWN {
                writeln!(f, "  ... and {} more {what}", n - SHOWN)
            } else {
                Ok(())
            }
        };
        for (name, c) in self.missing.iter().take(SHOWN) {
            writeln!(
                f,
                "  missing     `{}`{}",
                shown(name),
                closest(c, "in the file")
            )?;
        }
        more(f, self.missing.len(), "missing")?;
        for (name, c) in self.unexpected.iter().take(SHOWN) {
            writeln!(
                f,
                "  unexpected  `{}`{}",
                shown(name),
                closest(c, "the model has")
            )?;
        }
        more(f, self.unexpected.len(), "unexpected")?;
        for (name, file, want) in self.shapes.iter().take(SHOWN) {
            writeln!(
                f,
                "  wrong shape `{}`: {file:?} in the file, the model needs {want:?}",
                shown(name)
            )?;
        }
        more(f, self.shapes.len(), "with the wrong shape")?;
        for (name, dtype) in self.dtypes.iter().take(SHOWN) {
            writeln!(
                f,
                "  wrong dtype `{}`: {dtype}; weights are F32, F16, BF16 or F64",
                shown(name)
            )?;
        }
        more(f, self.dtypes.len(), "of the wrong dtype")?;
        for (a, b) in &self.differ {
            writeln!(
                f,
                "  `{a}` and `{b}` are one tied tensor in the model but differ in the file"
            )?;
        }
        Ok(())
    }
}

/// The name among `candidates` nearest to `name` by edit distance (names of over 256 bytes,
/// never a parameter's, are not compared: the distance costs their product).
fn nearest(name: &str, candidates: &[&str]) -> Option<String> {
    const LONG: usize = 256;
    if name.len() > LONG {
        return None;
    }
    candidates
        .iter()
        .filter(|c| c.len() <= LONG)
        .min_by_key(|c| (edit_distance(name, c), c.len()))
        .map(|c| c.to_string())
}

/// The flat parameters of `model` from named tensors (name -> (shape, values)) in `format`:
/// every tensor the model needs must be there with its shape, and nothing else; a tied copy may
/// stand for the tensor it copies. `other` holds the file's tensors of non-float dtypes (name ->
/// dtype): wrong where the model needs them, unexpected elsewhere.
pub fn import(
    model: &dyn Model,
    format: WeightFormat,
    tensors: &HashMap<&str, (&[usize], &[f32])>,
    other: &HashMap<&str, &str>,
) -> Result<Vec<f32>, Mismatch> {
    let shapes: HashMap<&str, &[usize]> = tensors.iter().map(|(n, (s, _))| (*n, *s)).collect();
    let mut load = |n: &str| Ok(tensors.get(n).map(|t| t.1.to_vec()).unwrap_or_default());
    match import_with(model, format, &shapes, other, &mut load) {
        Ok(flat) => Ok(flat),
        Err(ImportError::Mismatch(m)) => Err(m),
        Err(ImportError::Read(e)) => unreachable!("values in memory: {e}"),
    }
}

/// Why `import_with` failed.
#[derive(Debug)]
pub enum ImportError {
    /// The names and shapes do not fit the model.
    Mismatch(Mismatch),
    /// `load` failed (its words).
    Read(String),
}

/// `import` from the names and shapes of a file's tensors (`shapes`), reading each tensor's
/// values with `load` only once every name and shape fits, one at a time, straight into the
/// flat parameters: a model loads with its parameters and one tensor in memory.
pub fn import_with(
    model: &dyn Model,
    format: WeightFormat,
    shapes: &HashMap<&str, &[usize]>,
    other: &HashMap<&str, &str>,
    load: &mut dyn FnMut(&str) -> Result<Vec<f32>, String>,
) -> Result<Vec<f32>, ImportError> {
    let layout = model.layout();
    let ext = externals(model, format);
    let mut bad = Mismatch::default();
    let mut used: HashSet<&str> = HashSet::new();
    let mut missing: Vec<&External> = Vec::new();
    // (the tensor to read, its aliases in the file to compare with it)
    let mut reads: Vec<(&External, &str, Vec<&str>)> = Vec::new();
    for e in ext.iter().filter(|e| !e.alias) {
        let aliases: Vec<&External> = ext
            .iter()
            .filter(|a| a.alias && a.param == e.param)
            .collect();
        let found = std::iter::once(e)
            .chain(aliases.iter().copied())
            .find_map(|cand| shapes.get(cand.name.as_str()).map(|s| (cand, *s)));
        for a in &aliases {
            if shapes.contains_key(a.name.as_str()) {
                used.insert(a.name.as_str());
            }
        }
        let Some((cand, shape)) = found else {
            // a base model's file has no LoRA adapters: they keep their own initial values
            // (`launch::init_from` fills them)
            if crate::model::lora::is_adapter(&layout.params[e.param].name) {
                continue;
            }
            match std::iter::once(e)
                .chain(aliases.iter().copied())
                .find_map(|cand| other.get(cand.name.as_str()).map(|d| (cand, d)))
            {
                Some((cand, dtype)) => bad.dtypes.push((cand.name.clone(), dtype.to_string())),
                None => missing.push(e),
            }
            continue;
        };
        used.insert(cand.name.as_str());
        if shape != e.shape.as_slice() {
            bad.shapes
                .push((cand.name.clone(), shape.to_vec(), e.shape.clone()));
            continue;
        }
        // both names of a tied tensor: they must agree
        let mut twins = Vec::new();
        for a in aliases.iter().filter(|a| a.name != cand.name) {
            match shapes.get(a.name.as_str()) {
                Some(s) if *s != e.shape.as_slice() => {
                    bad.shapes
                        .push((a.name.clone(), s.to_vec(), e.shape.clone()))
                }
                Some(_) => twins.push(a.name.as_str()),
                None => {}
            }
        }
        reads.push((e, cand.name.as_str(), twins));
    }
    let claimed: HashSet<&str> = bad.dtypes.iter().map(|d| d.0.as_str()).collect();
    let mut unexpected: Vec<&str> = shapes
        .keys()
        .chain(other.keys())
        .copied()
        .filter(|n| !used.contains(n) && !claimed.contains(n))
        .collect();
    unexpected.sort();
    let want: Vec<&str> = missing.iter().map(|e| e.name.as_str()).collect();
    let all_want: Vec<&str> = ext.iter().map(|e| e.name.as_str()).collect();
    let all_have: Vec<&str> = shapes.keys().chain(other.keys()).copied().collect();
    for e in &missing {
        // the closest of what nothing else claimed, else of everything in the file
        let pool = if unexpected.is_empty() {
            &all_have
        } else {
            &unexpected
        };
        bad.missing.push((e.name.clone(), nearest(&e.name, pool)));
    }
    for n in &unexpected {
        let pool = if want.is_empty() { &all_want } else { &want };
        bad.unexpected.push((n.to_string(), nearest(n, pool)));
    }
    if !bad.is_empty() {
        return Err(ImportError::Mismatch(bad));
    }
    let mut flat = vec![0f32; layout.num_params()];
    for (e, name, twins) in reads {
        let values = load(name).map_err(ImportError::Read)?;
        for twin in twins {
            let other = load(twin).map_err(ImportError::Read)?;
            if other
                .iter()
                .zip(values.iter())
                .any(|(a, b)| a.to_bits() != b.to_bits())
            {
                bad.differ.push((e.name.clone(), twin.to_string()));
            }
        }
        let p = &layout.params[e.param];
        if e.transpose {
            flat[p.range()].copy_from_slice(&transpose(&values, e.shape[0], e.shape[1]));
        } else {
            flat[p.range()].copy_from_slice(&values);
        }
    }
    if bad.is_empty() {
        Ok(flat)
    } else {
        Err(ImportError::Mismatch(bad))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renumbers_list_items_only() {
        assert_eq!(renumber("layers.2.bias", "layers", |i| 2 * i), "4.bias");
        assert_eq!(renumber("layers.10", "layers", |i| i + 1), "11");
        assert_eq!(
            renumber("layersx.1.bias", "layers", |i| i),
            "layersx.1.bias"
        );
        assert_eq!(renumber("fcs.0.weight", "layers", |i| i), "fcs.0.weight");
    }

    #[test]
    fn transposes_row_major() {
        assert_eq!(
            transpose(&[1., 2., 3., 4., 5., 6.], 2, 3),
            [1., 4., 2., 5., 3., 6.]
        );
    }
}

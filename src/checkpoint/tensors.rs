//! safetensors files of named f32 tensors, written and read with the `safetensors` crate (the
//! format PyTorch, Hugging Face and Burn exchange weights in). Reading converts f16, bf16 and
//! f64 tensors to f32; any other dtype is an error naming the tensor.

use std::borrow::Cow;
use std::collections::HashMap;

use safetensors::tensor::{Dtype, SafeTensorError, SafeTensors, View};

/// A named tensor, read from a file.
#[derive(Debug, Clone, PartialEq)]
pub struct Named {
    pub name: String,
    pub shape: Vec<usize>,
    /// The values as f32; empty when `unsupported` is set.
    pub data: Vec<f32>,
    /// The dtype of a tensor kiln does not read as weights (`I64`, `BOOL`, ...), kept so that a
    /// caller can name it among its other findings.
    pub unsupported: Option<String>,
}

/// The tensors of a file, in the file's order, and its `__metadata__`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TensorFile {
    pub tensors: Vec<Named>,
    pub metadata: HashMap<String, String>,
}

impl TensorFile {
    pub fn get(&self, name: &str) -> Option<&Named> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Tensors by name.
    pub fn by_name(&self) -> HashMap<&str, &Named> {
        self.tensors.iter().map(|t| (t.name.as_str(), t)).collect()
    }
}

/// An f32 tensor to write, borrowing its values.
struct F32View<'a> {
    shape: Vec<usize>,
    data: &'a [f32],
}

impl View for F32View<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        if cfg!(target_endian = "little") {
            Cow::Borrowed(bytemuck::cast_slice(self.data))
        } else {
            Cow::Owned(self.data.iter().flat_map(|x| x.to_le_bytes()).collect())
        }
    }
    fn data_len(&self) -> usize {
        std::mem::size_of_val(self.data)
    }
}

/// The float dtype a file is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum FloatDtype {
    #[default]
    F32,
    Bf16,
    F16,
}

impl FloatDtype {
    /// kiln's name (`--dtype`): f32, bf16, f16.
    pub fn name(self) -> &'static str {
        match self {
            FloatDtype::F32 => "f32",
            FloatDtype::Bf16 => "bf16",
            FloatDtype::F16 => "f16",
        }
    }

    /// PyTorch's name, as transformers' config.json `torch_dtype` says it.
    pub fn torch_name(self) -> &'static str {
        match self {
            FloatDtype::F32 => "float32",
            FloatDtype::Bf16 => "bfloat16",
            FloatDtype::F16 => "float16",
        }
    }

    fn of(d: Dtype) -> Option<FloatDtype> {
        match d {
            Dtype::F32 => Some(FloatDtype::F32),
            Dtype::BF16 => Some(FloatDtype::Bf16),
            Dtype::F16 => Some(FloatDtype::F16),
            _ => None,
        }
    }
}

/// A tensor to write in a 16-bit dtype: its values rounded to it (round to nearest even, as
/// PyTorch's `.to(torch.bfloat16)`), little-endian.
struct HalfView {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl View for HalfView {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// `encode` in `dtype`: f32 values as they are, or rounded to bf16 or f16.
pub fn encode_as(
    tensors: &[(&str, &[usize], &[f32])],
    metadata: HashMap<String, String>,
    dtype: FloatDtype,
) -> Result<Vec<u8>, String> {
    let (d, half): (Dtype, fn(f32) -> [u8; 2]) = match dtype {
        FloatDtype::F32 => return encode(tensors, metadata),
        FloatDtype::Bf16 => (Dtype::BF16, |x| half::bf16::from_f32(x).to_le_bytes()),
        FloatDtype::F16 => (Dtype::F16, |x| half::f16::from_f32(x).to_le_bytes()),
    };
    serialize(tensors, metadata, |shape, data| HalfView {
        dtype: d,
        shape: shape.to_vec(),
        bytes: data.iter().flat_map(|&x| half(x)).collect(),
    })
}

/// The bytes of a safetensors file holding `tensors` (name, shape, values) and `metadata`.
/// Every tensor's values must fill its shape.
pub fn encode(
    tensors: &[(&str, &[usize], &[f32])],
    metadata: HashMap<String, String>,
) -> Result<Vec<u8>, String> {
    serialize(tensors, metadata, |shape, data| F32View {
        shape: shape.to_vec(),
        data,
    })
}

/// `tensors` as the views `view` makes of them, checked (one name each, values filling their
/// shape), serialized with `metadata` in name order.
fn serialize<'a, V: View>(
    tensors: &[(&'a str, &[usize], &'a [f32])],
    metadata: HashMap<String, String>,
    view: impl Fn(&[usize], &'a [f32]) -> V,
) -> Result<Vec<u8>, String> {
    let mut views = Vec::with_capacity(tensors.len());
    let mut seen = std::collections::HashSet::new();
    for &(name, shape, data) in tensors {
        if !seen.insert(name) {
            return Err(format!("two tensors are named `{name}`"));
        }
        if shape.iter().product::<usize>() != data.len() {
            return Err(format!(
                "tensor `{name}`: shape {shape:?} does not hold {} values",
                data.len()
            ));
        }
        views.push((name, view(shape, data)));
    }
    let mut bytes =
        safetensors::tensor::serialize(views, Some(metadata)).map_err(|e| describe(&e))?;
    sort_metadata(&mut bytes);
    Ok(bytes)
}

/// Puts the header's `__metadata__` entries in name order, in place: safetensors writes them
/// in a `HashMap`'s order, which differs from one map to the next, so the same tensors would
/// give different bytes (and checksums) from one save to the next. Same length: the same
/// entries, compact, as serde_json writes them.
fn sort_metadata(bytes: &mut [u8]) {
    const KEY: &[u8] = b"\"__metadata__\":";
    let Some(n) = bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .map(|b| u64::from_le_bytes(b) as usize)
    else {
        return;
    };
    let Some(header) = bytes.get_mut(8..8 + n) else {
        return;
    };
    let Some(at) = header.windows(KEY.len()).position(|w| w == KEY) else {
        return;
    };
    let start = at + KEY.len();
    let mut it = serde_json::Deserializer::from_slice(&header[start..])
        .into_iter::<std::collections::BTreeMap<String, String>>();
    let Some(Ok(sorted)) = it.next() else {
        return;
    };
    let end = start + it.byte_offset();
    if let Ok(text) = serde_json::to_vec(&sorted) {
        if text.len() == end - start {
            header[start..end].copy_from_slice(&text);
        }
    }
}

/// The JSON header of a safetensors file's `bytes` (after its 8-byte length), when the length
/// fits in them.
fn header_bytes(bytes: &[u8]) -> Option<&[u8]> {
    let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    let end = 8usize.checked_add(usize::try_from(n).ok()?)?;
    bytes.get(8..end)
}

/// A name the header's JSON object has twice (JSON parsers keep one of them silently, so the
/// file would read as whichever came first or last); `None` when each is once or the header
/// does not parse (the safetensors reader then says why).
fn duplicate_name(bytes: &[u8]) -> Option<String> {
    use serde::de::{Deserializer as _, IgnoredAny, MapAccess, Visitor};
    struct Keys;
    impl<'de> Visitor<'de> for Keys {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<String>, A::Error> {
            let mut seen = std::collections::HashSet::new();
            while let Some(key) = map.next_key::<String>()? {
                map.next_value::<IgnoredAny>()?;
                if !seen.insert(key.clone()) {
                    return Ok(Some(key));
                }
            }
            Ok(None)
        }
    }
    serde_json::Deserializer::from_slice(header_bytes(bytes)?)
        .deserialize_map(Keys)
        .ok()
        .flatten()
}

/// Whether a tensor in the header of `bytes` (a safetensors file, or its first `8 + n` bytes)
/// has a dtype safetensors does not know: read from the JSON itself, as the header's own
/// deserialization error says it only in words.
fn unknown_dtype(bytes: &[u8]) -> bool {
    let header = header_bytes(bytes)
        .and_then(|h| serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(h).ok());
    header.is_some_and(|header| {
        header
            .iter()
            .filter(|(name, _)| name.as_str() != "__metadata__")
            .filter_map(|(_, info)| info.get("dtype")?.as_str())
            .any(|d| {
                serde_json::from_value::<safetensors::Dtype>(serde_json::Value::from(d)).is_err()
            })
    })
}

/// What a header that does not deserialize means: a dtype safetensors does not know, or no
/// safetensors file at all.
fn describe_header(bytes: &[u8], e: SafeTensorError, len: usize) -> String {
    match (unknown_dtype(bytes), &e) {
        // serde's words, as before (`unknown variant `Q4`, expected one of ...`): the dtype was
        // found in the JSON, not in them
        (true, SafeTensorError::InvalidHeaderDeserialization(j)) => {
            format!("a tensor has a dtype safetensors does not know ({j})")
        }
        _ => describe_read(&e, len),
    }
}

/// Reads a safetensors file's bytes: every float tensor as f32 (others are marked
/// `unsupported`), and the metadata.
pub fn decode(bytes: &[u8]) -> Result<TensorFile, String> {
    if let Some(name) = duplicate_name(bytes) {
        return Err(format!(
            "the header names tensor `{name}` twice; a safetensors file names each tensor once"
        ));
    }
    let st = SafeTensors::deserialize(bytes).map_err(|e| match e {
        SafeTensorError::InvalidHeaderDeserialization(_) => describe_header(bytes, e, bytes.len()),
        e => describe_read(&e, bytes.len()),
    })?;
    let (_, meta) =
        SafeTensors::read_metadata(bytes).map_err(|e| describe_read(&e, bytes.len()))?;
    let metadata = meta.metadata().clone().unwrap_or_default();
    let mut tensors = Vec::with_capacity(st.len());
    // in the file's order (by offset), so a reader sees what a writer wrote
    let mut views: Vec<_> = st.iter().collect();
    views.sort_by_key(|(_, v)| v.data().as_ptr() as usize);
    for (name, view) in views {
        let (data, unsupported) = match to_f32(view.dtype(), view.data()) {
            Some(data) => (data, None),
            None => (Vec::new(), Some(format!("{:?}", view.dtype()))),
        };
        tensors.push(Named {
            name: name.to_string(),
            shape: view.shape().to_vec(),
            data,
            unsupported,
        });
    }
    Ok(TensorFile { tensors, metadata })
}

/// Little-endian values of `dtype` as f32; `None` for a dtype that is not a float type.
fn to_f32(dtype: Dtype, raw: &[u8]) -> Option<Vec<f32>> {
    Some(match dtype {
        Dtype::F32 => match bytemuck::try_cast_slice::<u8, f32>(raw) {
            Ok(v) if cfg!(target_endian = "little") => v.to_vec(),
            _ => raw
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        },
        Dtype::F16 => raw
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::BF16 => raw
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::F64 => raw
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f32)
            .collect(),
        _ => return None,
    })
}

/// A tensor of a file opened with `Lazy::open`: its name, shape and dtype, its values unread.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub name: String,
    pub shape: Vec<usize>,
    /// The dtype of a tensor that is not of a float type (`I64`, ...), as in `Named`.
    pub unsupported: Option<String>,
    dtype: Dtype,
    /// Byte offsets in the file.
    start: u64,
    end: u64,
}

/// A safetensors file read one tensor at a time: `open` reads and checks the header (the
/// same checks and words as `decode`), `read` reads one tensor's bytes, so a model larger than
/// the memory left beside its f32 parameters still loads.
#[derive(Debug)]
pub struct Lazy {
    file: std::fs::File,
    /// In the file's order.
    pub entries: Vec<Entry>,
    pub metadata: HashMap<String, String>,
}

impl Lazy {
    pub fn open(path: &std::path::Path) -> Result<Lazy, String> {
        use std::io::Read;
        let mut file = std::fs::File::open(path).map_err(|e| format!("cannot read: {e}"))?;
        let len = file
            .metadata()
            .map_err(|e| format!("cannot read: {e}"))?
            .len();
        let mut prefix = [0u8; 8];
        if len < 8 || file.read_exact(&mut prefix).is_err() {
            return Err(describe_read(
                &SafeTensorError::HeaderTooSmall,
                len as usize,
            ));
        }
        let n = u64::from_le_bytes(prefix);
        if n > 100_000_000 {
            return Err(describe_read(
                &SafeTensorError::HeaderTooLarge,
                len as usize,
            ));
        }
        if n + 8 > len {
            return Err(describe_read(
                &SafeTensorError::InvalidHeaderLength,
                len as usize,
            ));
        }
        let mut bytes = prefix.to_vec();
        bytes.resize(8 + n as usize, 0);
        file.read_exact(&mut bytes[8..])
            .map_err(|e| format!("cannot read: {e}"))?;
        if let Some(name) = duplicate_name(&bytes) {
            return Err(format!(
                "the header names tensor `{name}` twice; a safetensors file names each tensor once"
            ));
        }
        let header: safetensors::tensor::Metadata =
            serde_json::from_slice(&bytes[8..]).map_err(|e| {
                describe_header(
                    &bytes,
                    SafeTensorError::InvalidHeaderDeserialization(e),
                    len as usize,
                )
            })?;
        let data = len - 8 - n;
        let mut entries = Vec::new();
        for (name, info) in header.tensors() {
            let (a, b) = (info.data_offsets.0 as u64, info.data_offsets.1 as u64);
            // (offsets past the file: said before any arithmetic on them)
            if a > data || b > data {
                return Err(describe_read(
                    &SafeTensorError::MetadataIncompleteBuffer,
                    len as usize,
                ));
            }
            entries.push(Entry {
                name,
                shape: info.shape.clone(),
                unsupported: to_f32(info.dtype, &[])
                    .is_none()
                    .then(|| format!("{:?}", info.dtype)),
                dtype: info.dtype,
                start: 8 + n + a,
                end: 8 + n + b,
            });
        }
        entries.sort_by_key(|e| e.start);
        // the tensors' bytes one after the other, each its shape's size, up to the file's end
        let mut at = 8 + n;
        for e in &entries {
            let bits = e
                .shape
                .iter()
                .try_fold(e.dtype.bitsize() as u64, |a, &d| a.checked_mul(d as u64));
            if e.start != at
                || e.end < e.start
                || bits.map(|b| b.div_ceil(8)) != Some(e.end - e.start)
            {
                return Err(describe_read(
                    &SafeTensorError::TensorInvalidInfo,
                    len as usize,
                ));
            }
            at = e.end;
        }
        if at != len {
            return Err(describe_read(
                &SafeTensorError::MetadataIncompleteBuffer,
                len as usize,
            ));
        }
        Ok(Lazy {
            file,
            entries,
            metadata: header.metadata().clone().unwrap_or_default(),
        })
    }

    /// The float dtype most of the file's values are stored in (by bytes), if any.
    pub fn float_dtype(&self) -> Option<FloatDtype> {
        let mut bytes: HashMap<&'static str, (FloatDtype, u64)> = HashMap::new();
        for e in &self.entries {
            if let Some(d) = FloatDtype::of(e.dtype) {
                bytes.entry(d.name()).or_insert((d, 0)).1 += e.end - e.start;
            }
        }
        bytes
            .into_values()
            .max_by_key(|(d, n)| (*n, d.name()))
            .map(|(d, _)| d)
    }

    /// The values of `entries[i]` as f32 (empty for a tensor that is not of a float type).
    pub fn read(&self, i: usize) -> Result<Vec<f32>, String> {
        use std::os::unix::fs::FileExt;
        let e = &self.entries[i];
        let mut raw = vec![0u8; (e.end - e.start) as usize];
        self.file
            .read_exact_at(&mut raw, e.start)
            .map_err(|err| format!("cannot read tensor `{}`: {err}", e.name))?;
        Ok(to_f32(e.dtype, &raw).unwrap_or_default())
    }
}

fn describe(e: &SafeTensorError) -> String {
    format!("safetensors: {e}")
}

/// What went wrong reading a file of `len` bytes, in words a user can act on.
fn describe_read(e: &SafeTensorError, len: usize) -> String {
    use SafeTensorError as E;
    match e {
        E::HeaderTooSmall => format!(
            "not a safetensors file: {len} bytes, too short for the 8-byte header length (truncated?)"
        ),
        E::InvalidHeaderLength => format!(
            "not a safetensors file, or truncated: its header length is larger than the file \
             ({len} bytes)"
        ),
        E::HeaderTooLarge => {
            "not a safetensors file: its header length is over safetensors' 100 MB limit".into()
        }
        E::InvalidHeaderStart | E::InvalidHeader(_) | E::InvalidHeaderDeserialization(_) => {
            format!("not a safetensors file: its header is not the expected JSON ({e})")
        }
        E::MetadataIncompleteBuffer => format!(
            "truncated or damaged safetensors file: the tensors' data does not match the file's \
             length ({len} bytes)"
        ),
        E::TensorInvalidInfo | E::InvalidOffset(_) => {
            format!("damaged safetensors file: a tensor's shape and dtype disagree with its data ({e})")
        }
        other => format!("invalid safetensors file: {other}"),
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_same_tensors_and_metadata_give_the_same_bytes() {
        let data = [1.0f32, 2.0];
        let meta = || -> HashMap<String, String> {
            (0..12)
                .map(|i| {
                    (
                        format!("key.{i}"),
                        format!("{{\"v\": [{i}], \"s\": \"}}\"}}"),
                    )
                })
                .collect()
        };
        let first = encode(&[("t", &[2], &data)], meta()).unwrap();
        for _ in 0..20 {
            assert_eq!(encode(&[("t", &[2], &data)], meta()).unwrap(), first);
        }
        let n = u64::from_le_bytes(first[..8].try_into().unwrap()) as usize;
        let header: serde_json::Value = serde_json::from_slice(&first[8..8 + n]).unwrap();
        assert_eq!(
            header["__metadata__"]["key.3"],
            "{\"v\": [3], \"s\": \"}\"}"
        );
    }
    use super::*;

    #[test]
    fn round_trips_in_order_with_metadata() {
        let a = [1.5f32, -2.0, 3.25, 4.0];
        let b = [7.0f32];
        let meta = HashMap::from([("step".to_string(), "3".to_string())]);
        let bytes = encode(&[("z.w", &[2, 2], &a), ("a.b", &[1], &b)], meta.clone()).unwrap();
        let f = decode(&bytes).unwrap();
        assert_eq!(f.metadata, meta);
        let names: Vec<&str> = f.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(f.get("z.w").unwrap().data, a);
        assert_eq!(f.get("z.w").unwrap().shape, vec![2, 2]);
        assert_eq!(f.get("a.b").unwrap().data, b);
        assert_eq!(names.len(), 2);
        assert!(encode(&[("x", &[3], &a)], HashMap::new()).is_err());
        let dup = encode(&[("x", &[1], &b), ("x", &[1], &b)], HashMap::new());
        assert!(dup.unwrap_err().contains("two tensors are named `x`"));
    }

    #[test]
    fn damage_is_described() {
        let bytes = encode(&[("w", &[4], &[1.0f32; 4])], HashMap::new()).unwrap();
        assert!(decode(&bytes[..4]).unwrap_err().contains("too short"));
        assert!(decode(&bytes[..bytes.len() - 2])
            .unwrap_err()
            .contains("truncated"));
        assert!(decode(b"hello world, not a tensor file")
            .unwrap_err()
            .contains("not a safetensors file"));
        let mut huge = bytes.clone();
        huge[..8].copy_from_slice(&(1u64 << 20).to_le_bytes());
        assert!(decode(&huge).unwrap_err().contains("larger than the file"));
    }
}

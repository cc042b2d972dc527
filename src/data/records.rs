//! Files of records, as `datasets`, torchtitan and TRL read them: JSON Lines (plain, `.gz` or
//! `.zst`) and Parquet. A record's text field (`data.text_field`) is one document; its other
//! fields are ignored. `data.path` names a file, a directory (its shards of the format, in name
//! order) or a glob of shards. Files are read as streams, a line or a row at a time; nothing
//! holds a whole file.
//!
//! Every bad record is an error naming the file, where in it (the line of a jsonl file; the row
//! group and row of a parquet file, both from 0 as pyarrow counts them) and the key:
//! a line that is not JSON, a record that is not an object, a missing text field, a text that
//! is not a string (or a parquet column whose type is not a string), an unreadable or empty
//! shard, a glob that matches nothing.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parquet::basic::{ConvertedType, LogicalType, Type as Physical};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::reader::RowIter;
use parquet::record::Row;
use parquet::schema::types::Type;

use super::shape::json_kind;
pub use super::shape::{Content, Shape};
use super::DataError;

/// A format of record files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// JSON Lines: one JSON object per line (`.jsonl`, `.ndjson`, `.jsonl.gz`, `.jsonl.zst`).
    Jsonl,
    /// Apache Parquet (`.parquet`).
    Parquet,
}

impl Format {
    /// The file names a directory's shards of this format end with.
    fn suffixes(self) -> &'static [&'static str] {
        match self {
            // (not `.json`: a dataset directory holds `dataset_info.json` and `state.json`
            // beside its shards; a `.json` file of JSON Lines is read when named itself)
            Format::Jsonl => &[".jsonl", ".jsonl.gz", ".jsonl.zst", ".ndjson"],
            Format::Parquet => &[".parquet"],
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Format::Jsonl => "jsonl",
            Format::Parquet => "parquet",
        }
    }
}

/// The shards `spec` names (the value of `key`): the file itself; a directory's files of
/// `format`, in name order; or the files a glob (`*`, `?`, `[...]`, `**`) matches, in name
/// order. An error when there are none.
pub fn shards(spec: &Path, format: Format, key: &'static str) -> Result<Vec<PathBuf>, DataError> {
    let text = spec.to_string_lossy();
    let glob_chars = ['*', '?', '['];
    if !spec.exists() && text.contains(glob_chars) {
        let paths = glob::glob(&text).map_err(|e| {
            DataError::Invalid(format!("`{key}` = \"{text}\" is not a valid glob: {e}"))
        })?;
        let mut out = Vec::new();
        for p in paths {
            let p = p.map_err(|e| DataError::Io {
                path: e.path().to_path_buf(),
                key,
                source: e.into(),
            })?;
            if p.is_file() {
                out.push(p);
            }
        }
        out.sort();
        if out.is_empty() {
            return Err(DataError::Invalid(format!(
                "`{key}` = \"{text}\" matches no file\n  = help: check the pattern (`*` within a name, `**` across directories)"
            )));
        }
        return Ok(out);
    }
    let meta = std::fs::metadata(spec).map_err(|source| DataError::Io {
        path: spec.to_path_buf(),
        key,
        source,
    })?;
    if !meta.is_dir() {
        return Ok(vec![spec.to_path_buf()]);
    }
    let entries = std::fs::read_dir(spec).map_err(|source| DataError::Io {
        path: spec.to_path_buf(),
        key,
        source,
    })?;
    let mut out = Vec::new();
    for e in entries {
        let e = e.map_err(|source| DataError::Io {
            path: spec.to_path_buf(),
            key,
            source,
        })?;
        let name = e.file_name().to_string_lossy().into_owned();
        if format.suffixes().iter().any(|s| name.ends_with(s)) && e.path().is_file() {
            out.push(e.path());
        }
    }
    out.sort();
    if out.is_empty() {
        return Err(DataError::Invalid(format!(
            "`{key}`: the directory {} has no {} file ({})",
            spec.display(),
            format.name(),
            format.suffixes().join(", ")
        )));
    }
    Ok(out)
}

/// Where a record is in its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    /// A jsonl line, from 1.
    Line(usize),
    /// A parquet row group and a row in it, both from 0.
    Row { group: usize, row: usize },
}

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            At::Line(l) => write!(f, "line {l}"),
            At::Row { group, row } => write!(f, "row group {group}, row {row}"),
        }
    }
}

/// One record's content and where it is.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    pub content: Content,
    pub at: At,
}

impl Document {
    /// The text of a text record (`None` for the other shapes).
    pub fn text(&self) -> Option<&str> {
        match &self.content {
            Content::Text(t) => Some(t),
            _ => None,
        }
    }
}

/// The documents of one file, in order, read as a stream: each item a document or the error
/// of its record (after which the stream ends).
pub struct Documents {
    path: PathBuf,
    shape: Shape,
    file_key: &'static str,
    inner: Inner,
    /// Records read so far (an empty file is an error).
    count: usize,
    done: bool,
}

enum Inner {
    Jsonl {
        lines: Box<dyn BufRead + Send>,
        line: usize,
        buf: Vec<u8>,
    },
    Parquet {
        rows: RowIter<'static>,
        /// Rows per row group, and the group and row of the next row.
        groups: Vec<usize>,
        group: usize,
        row: usize,
    },
}

impl Documents {
    /// Opens `path` (a shard of `format`, named by `file_key`, e.g. `data.path`) for its
    /// records' `field` (the value of `key`, e.g. `data.text_field`).
    pub fn open(
        path: &Path,
        format: Format,
        field: &str,
        key: &'static str,
        file_key: &'static str,
    ) -> Result<Documents, DataError> {
        let shape = Shape::Text {
            field: field.to_string(),
            key,
        };
        Documents::open_shape(path, format, &shape, file_key)
    }

    /// Opens `path` for records of `shape`.
    pub fn open_shape(
        path: &Path,
        format: Format,
        shape: &Shape,
        file_key: &'static str,
    ) -> Result<Documents, DataError> {
        let io = |source| DataError::Io {
            path: path.to_path_buf(),
            key: file_key,
            source,
        };
        let inner = match format {
            Format::Jsonl => {
                let file = File::open(path).map_err(io)?;
                let name = path.to_string_lossy();
                let read: Box<dyn Read + Send> = if name.ends_with(".gz") {
                    Box::new(flate2::read::MultiGzDecoder::new(file))
                } else if name.ends_with(".zst") {
                    Box::new(zstd::stream::read::Decoder::new(file).map_err(io)?)
                } else {
                    Box::new(file)
                };
                Inner::Jsonl {
                    lines: Box::new(BufReader::with_capacity(1 << 16, read)),
                    line: 0,
                    buf: Vec::new(),
                }
            }
            Format::Parquet => open_parquet(path, shape, file_key)?,
        };
        Ok(Documents {
            path: path.to_path_buf(),
            shape: shape.clone(),
            file_key,
            inner,
            count: 0,
            done: false,
        })
    }

    fn bad(&self, at: At, message: String) -> DataError {
        DataError::Invalid(format!("{}: {at}: {message}", self.path.display()))
    }

    fn next_jsonl(&mut self) -> Option<Result<Document, DataError>> {
        let Inner::Jsonl { lines, line, buf } = &mut self.inner else {
            return None;
        };
        loop {
            buf.clear();
            *line += 1;
            let at = At::Line(*line);
            match lines.read_until(b'\n', buf) {
                Ok(0) => return None,
                Ok(_) => {}
                Err(source) => {
                    return Some(Err(DataError::Io {
                        path: self.path.clone(),
                        key: self.file_key,
                        source,
                    }))
                }
            }
            let mut text = buf.trim_ascii();
            if *line == 1 {
                // (a UTF-8 byte-order mark, as some Windows editors write one)
                text = text.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(text);
            }
            if text.is_empty() {
                // (blank lines, a trailing one too, are not records)
                continue;
            }
            let value: serde_json::Value = match serde_json::from_slice(text) {
                Ok(v) => v,
                Err(e) => {
                    return Some(Err(self.bad(
                        at,
                        format!(
                            "not JSON ({e})\n  = help: each line of a JSON Lines file is one object, such as {{\"{}\": \"...\"}}",
                            self.shape.fields()[0]
                        ),
                    )))
                }
            };
            let serde_json::Value::Object(record) = value else {
                return Some(Err(self.bad(
                    at,
                    format!("a record must be a JSON object, not {}", json_kind(&value)),
                )));
            };
            return Some(
                self.content(record)
                    .map(|content| Document { content, at })
                    .map_err(|m| self.bad(at, m)),
            );
        }
    }

    /// A record's content, as its shape says, or what is wrong with it.
    fn content(
        &self,
        mut record: serde_json::Map<String, serde_json::Value>,
    ) -> Result<Content, String> {
        // a missing field is said with the fields the record has
        if let Some(f) = self
            .shape
            .fields()
            .into_iter()
            .find(|f| !record.contains_key(*f))
        {
            return Err(self.missing(f, record.keys()));
        }
        self.shape.content(|f| record.remove(f))
    }

    fn next_parquet(&mut self) -> Option<Result<Document, DataError>> {
        let Inner::Parquet {
            rows,
            groups,
            group,
            row,
        } = &mut self.inner
        else {
            return None;
        };
        while *group < groups.len() && *row >= groups[*group] {
            *group += 1;
            *row = 0;
        }
        let at = At::Row {
            group: *group,
            row: *row,
        };
        let r = rows.next()?;
        *row += 1;
        Some(match r {
            Ok(r) => self
                .parquet_content(&r)
                .map(|content| Document { content, at })
                .map_err(|m| self.bad(at, m)),
            Err(e) => Err(self.bad(at, format!("cannot read the row: {e}"))),
        })
    }

    /// A parquet row's content (its columns are the shape's fields, checked when the file was
    /// opened to be strings, or a list for messages).
    fn parquet_content(&self, r: &Row) -> Result<Content, String> {
        self.shape.content(|f| {
            r.get_column_iter()
                .find(|(n, _)| n.as_str() == f)
                .map(|(_, v)| v.to_json_value())
        })
    }

    fn missing<'a>(&self, field: &str, keys: impl Iterator<Item = &'a String>) -> String {
        let keys: Vec<String> = keys.take(8).map(|k| format!("`{k}`")).collect();
        let fields = if keys.is_empty() {
            "none".to_string()
        } else {
            keys.join(", ")
        };
        let help = match &self.shape {
            Shape::Text { key, .. } => format!("set `{key}` to the field that holds the text"),
            Shape::PromptCompletion => "a prompt-completion record has string fields `prompt` and `completion`; set `data.format` if the records are of another shape".into(),
            Shape::Messages { .. } => "a conversation is a list of messages (`[{\"role\": \"user\", \"content\": \"...\"}, ...]`); set `data.messages_field` to the field that holds it, or `data.format` if the records are of another shape".into(),
        };
        format!(
            "the record has no `{field}` ({}); its fields: {fields}\n  = help: {help}",
            self.shape.key()
        )
    }
}

impl Iterator for Documents {
    type Item = Result<Document, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let next = match self.inner {
            Inner::Jsonl { .. } => self.next_jsonl(),
            Inner::Parquet { .. } => self.next_parquet(),
        };
        match &next {
            Some(Ok(_)) => self.count += 1,
            Some(Err(_)) => self.done = true,
            None => {
                self.done = true;
                if self.count == 0 {
                    return Some(Err(DataError::Invalid(format!(
                        "{} ({}): the file has no records",
                        self.path.display(),
                        self.file_key
                    ))));
                }
            }
        }
        next
    }
}

/// The fields of the first record of `path` (a jsonl object's keys, a parquet file's
/// columns), to tell the records' shape by (`data.format = "auto"`); `file_key` names the file.
pub fn first_fields(
    path: &Path,
    format: Format,
    file_key: &'static str,
) -> Result<Vec<String>, DataError> {
    match format {
        Format::Parquet => {
            let file = File::open(path).map_err(|source| DataError::Io {
                path: path.to_path_buf(),
                key: file_key,
                source,
            })?;
            let reader = SerializedFileReader::new(file).map_err(|e| {
                DataError::Invalid(format!(
                    "{}: not a readable parquet file ({e})\n  = help: is `data.kind` right? JSON Lines files are `data.kind = \"jsonl\"`",
                    path.display()
                ))
            })?;
            let meta = reader.metadata();
            let schema = meta.file_metadata().schema_descr();
            Ok(schema
                .root_schema()
                .get_fields()
                .iter()
                .map(|f| f.name().to_string())
                .collect())
        }
        Format::Jsonl => {
            // (opened as records of any shape: only its first line is read here)
            let probe = Shape::Text {
                field: "\u{0}".into(),
                key: "data.format",
            };
            let mut d = Documents::open_shape(path, format, &probe, file_key)?;
            let Inner::Jsonl { lines, line, buf } = &mut d.inner else {
                return Ok(Vec::new());
            };
            loop {
                buf.clear();
                *line += 1;
                let n = lines
                    .read_until(b'\n', buf)
                    .map_err(|source| DataError::Io {
                        path: path.to_path_buf(),
                        key: file_key,
                        source,
                    })?;
                if n == 0 {
                    return Ok(Vec::new());
                }
                let mut text = buf.trim_ascii();
                if *line == 1 {
                    text = text.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(text);
                }
                if text.is_empty() {
                    continue;
                }
                return Ok(match serde_json::from_slice::<serde_json::Value>(text) {
                    Ok(serde_json::Value::Object(o)) => o.keys().cloned().collect(),
                    // (what is wrong with it is said when it is read as a record)
                    _ => Vec::new(),
                });
            }
        }
    }
}

/// A parquet file opened for its column `field`, checked to be a string column.
fn open_parquet(path: &Path, shape: &Shape, file_key: &'static str) -> Result<Inner, DataError> {
    let file = File::open(path).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        key: file_key,
        source,
    })?;
    let bad = |m: String| DataError::Invalid(format!("{}: {m}", path.display()));
    let reader = SerializedFileReader::new(file)
        .map_err(|e| {
            bad(format!(
                "not a readable parquet file ({e})\n  = help: is `data.kind` right? JSON Lines files are `data.kind = \"jsonl\"`"
            ))
        })?;
    let meta = reader.metadata();
    let schema = meta.file_metadata().schema_descr();
    let fields = schema.root_schema().get_fields();
    let key = shape.key();
    let mut columns = Vec::new();
    for field in shape.fields() {
        let Some(column) = fields.iter().find(|f| f.name() == field) else {
            let names: Vec<String> = fields
                .iter()
                .take(8)
                .map(|f| format!("`{}`", f.name()))
                .collect();
            let help = match shape {
                Shape::Text { .. } => format!("set `{key}` to the column that holds the text"),
                _ => "set `data.format` (and `data.messages_field`) to the records' shape".into(),
            };
            return Err(bad(format!(
                "no column `{field}` ({key}); its columns: {}\n  = help: {help}",
                names.join(", ")
            )));
        };
        let messages = matches!(shape, Shape::Messages { .. });
        if messages && column.is_primitive() {
            return Err(bad(format!(
                "column `{field}` ({key}) is {}, not a list of messages",
                describe_type(column)
            )));
        }
        if !messages && !is_string(column) {
            return Err(bad(format!(
                "column `{field}` ({key}) is {}, not a string",
                describe_type(column)
            )));
        }
        columns.push(Arc::clone(column));
    }
    let groups: Vec<usize> = meta
        .row_groups()
        .iter()
        .map(|g| g.num_rows().max(0) as usize)
        .collect();
    let names = shape.fields().join("`, `");
    let projection = Type::group_type_builder("schema")
        .with_fields(columns)
        .build()
        .map_err(|e| bad(format!("cannot read column `{names}` ({e})")))?;
    let rows = RowIter::from_file_into(Box::new(reader))
        .project(Some(projection))
        .map_err(|e| bad(format!("cannot read column `{names}` ({e})")))?;
    Ok(Inner::Parquet {
        rows,
        groups,
        group: 0,
        row: 0,
    })
}

/// Whether a parquet column holds strings (UTF-8 byte arrays, as pyarrow writes `string` and
/// `large_string`).
fn is_string(t: &Type) -> bool {
    if !t.is_primitive() || t.get_physical_type() != Physical::BYTE_ARRAY {
        return false;
    }
    let info = t.get_basic_info();
    matches!(info.logical_type_ref(), Some(LogicalType::String))
        || info.converted_type() == ConvertedType::UTF8
}

fn describe_type(t: &Type) -> String {
    if !t.is_primitive() {
        return "a group (a struct or a list)".into();
    }
    let info = t.get_basic_info();
    match info.logical_type_ref() {
        Some(l) => format!("{:?} ({l:?})", t.get_physical_type()),
        None => format!("{:?}", t.get_physical_type()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn texts(d: Documents) -> Result<Vec<String>, String> {
        d.map(|r| {
            r.map(|d| d.text().unwrap().to_string())
                .map_err(|e| e.to_string())
        })
        .collect()
    }

    #[test]
    fn jsonl_plain_gz_and_zst_give_the_same_documents() {
        let dir = crate::testdir::tempdir().unwrap();
        let body = "\u{feff}{\"text\": \"one\", \"id\": 1}\r\n\n{\"id\": 2, \"text\": \"two \\u00e9\\n\"}\n";
        let plain = dir.path().join("a.jsonl");
        std::fs::write(&plain, body).unwrap();
        let gz = dir.path().join("a.jsonl.gz");
        let mut e = flate2::write::GzEncoder::new(File::create(&gz).unwrap(), Default::default());
        e.write_all(body.as_bytes()).unwrap();
        e.finish().unwrap();
        let zst = dir.path().join("a.jsonl.zst");
        std::fs::write(&zst, zstd::encode_all(body.as_bytes(), 3).unwrap()).unwrap();
        for p in [&plain, &gz, &zst] {
            let d =
                Documents::open(p, Format::Jsonl, "text", "data.text_field", "data.path").unwrap();
            assert_eq!(texts(d).unwrap(), ["one", "two é\n"], "{}", p.display());
        }
        let d = Documents::open(
            &plain,
            Format::Jsonl,
            "text",
            "data.text_field",
            "data.path",
        )
        .unwrap();
        let at: Vec<At> = d.map(|r| r.unwrap().at).collect();
        assert_eq!(at, [At::Line(1), At::Line(3)]);
    }

    #[test]
    fn bad_records_name_the_file_the_line_and_the_key() {
        let dir = crate::testdir::tempdir().unwrap();
        let cases = [
            (
                "{\"text\": \"ok\"}\n{\"text\": \"ok\"\n",
                "line 2: not JSON",
            ),
            (
                "{\"text\": \"ok\"}\n[1, 2]\n",
                "line 2: a record must be a JSON object, not an array",
            ),
            (
                "{\"body\": \"x\", \"n\": 1}\n",
                "line 1: the record has no `text` (data.text_field); its fields: `body`, `n`",
            ),
            (
                "{\"text\": 3}\n",
                "line 1: `text` (data.text_field) is a number, not a string",
            ),
            ("\n\n", "the file has no records"),
        ];
        for (i, (body, want)) in cases.iter().enumerate() {
            let p = dir.path().join(format!("bad{i}.jsonl"));
            std::fs::write(&p, body).unwrap();
            let d =
                Documents::open(&p, Format::Jsonl, "text", "data.text_field", "data.path").unwrap();
            let err = texts(d).unwrap_err();
            assert!(err.contains(&p.display().to_string()), "{err}");
            assert!(err.contains(want), "{err}\nwants: {want}");
        }
    }

    #[test]
    fn a_prompt_completion_record_without_a_field_lists_the_ones_it_has() {
        let dir = crate::testdir::tempdir().unwrap();
        for (body, want) in [
            (
                "{\"prompt\": \"1 plus 2\"}\n",
                "line 1: the record has no `completion` (data.format); its fields: `prompt`",
            ),
            (
                "{\"completion\": \"3\", \"extra\": 1}\n",
                "line 1: the record has no `prompt` (data.format); its fields: `completion`, `extra`",
            ),
            (
                "{\"prompt\": \"1\", \"completion\": 3}\n",
                "line 1: `completion` (data.format) is a number, not a string",
            ),
        ] {
            let p = dir.path().join("pc.jsonl");
            std::fs::write(&p, body).unwrap();
            let d = Documents::open_shape(&p, Format::Jsonl, &Shape::PromptCompletion, "data.path")
                .unwrap();
            let err = d.map(|r| r.map(|_| ())).collect::<Result<Vec<_>, _>>().unwrap_err();
            assert!(err.to_string().contains(want), "{err}\nwants: {want}");
        }
    }

    #[test]
    fn shards_are_a_file_a_directorys_files_in_name_order_or_a_glob() {
        let dir = crate::testdir::tempdir().unwrap();
        let d = dir.path();
        for name in ["b.jsonl", "a.jsonl.gz", "c.txt", "d.parquet", "state.json"] {
            std::fs::write(d.join(name), "").unwrap();
        }
        let names = |v: Vec<PathBuf>| -> Vec<String> {
            v.iter()
                .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
                .collect()
        };
        let key = "data.path";
        assert_eq!(
            names(shards(d, Format::Jsonl, key).unwrap()),
            ["a.jsonl.gz", "b.jsonl"]
        );
        assert_eq!(
            names(shards(d, Format::Parquet, key).unwrap()),
            ["d.parquet"]
        );
        assert_eq!(
            names(shards(&d.join("c.txt"), Format::Jsonl, key).unwrap()),
            ["c.txt"]
        );
        let glob = d.join("*.jsonl*");
        assert_eq!(
            names(shards(&glob, Format::Jsonl, key).unwrap()),
            ["a.jsonl.gz", "b.jsonl"]
        );
        let none = shards(&d.join("x*.jsonl"), Format::Jsonl, key)
            .unwrap_err()
            .to_string();
        assert!(
            none.contains("matches no file") && none.contains(key),
            "{none}"
        );
        let empty = d.join("empty");
        std::fs::create_dir(&empty).unwrap();
        let e = shards(&empty, Format::Parquet, key)
            .unwrap_err()
            .to_string();
        assert!(e.contains("has no parquet file"), "{e}");
        let missing = shards(&d.join("nope.jsonl"), Format::Jsonl, key)
            .unwrap_err()
            .to_string();
        assert!(
            missing.contains("nope.jsonl") && missing.contains(key),
            "{missing}"
        );
    }

    /// A parquet file of `rows` in row groups of `per_group`, written with parquet's own
    /// writer (snappy), its column `text` a string (or an int64 with `ints`).
    fn write_parquet(path: &Path, rows: &[Option<&str>], per_group: usize, ints: bool) {
        use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
        use parquet::file::properties::WriterProperties;
        use parquet::file::writer::SerializedFileWriter;
        use parquet::schema::parser::parse_message_type;
        let schema = match ints {
            false => "message schema { OPTIONAL BYTE_ARRAY text (UTF8); REQUIRED INT64 id; }",
            true => "message schema { REQUIRED INT64 text; REQUIRED INT64 id; }",
        };
        let schema = Arc::new(parse_message_type(schema).unwrap());
        let props = Arc::new(
            WriterProperties::builder()
                .set_compression(parquet::basic::Compression::SNAPPY)
                .build(),
        );
        let mut w = SerializedFileWriter::new(File::create(path).unwrap(), schema, props).unwrap();
        for (g, chunk) in rows.chunks(per_group).enumerate() {
            let mut rg = w.next_row_group().unwrap();
            let mut col = rg.next_column().unwrap().unwrap();
            if ints {
                let v: Vec<i64> = (0..chunk.len() as i64).collect();
                col.typed::<Int64Type>()
                    .write_batch(&v, None, None)
                    .unwrap();
            } else {
                let values: Vec<ByteArray> = chunk
                    .iter()
                    .flatten()
                    .map(|s| ByteArray::from(*s))
                    .collect();
                let def: Vec<i16> = chunk.iter().map(|s| s.is_some() as i16).collect();
                col.typed::<ByteArrayType>()
                    .write_batch(&values, Some(&def), None)
                    .unwrap();
            }
            col.close().unwrap();
            let mut col = rg.next_column().unwrap().unwrap();
            let ids: Vec<i64> = (0..chunk.len())
                .map(|i| (g * per_group + i) as i64)
                .collect();
            col.typed::<Int64Type>()
                .write_batch(&ids, None, None)
                .unwrap();
            col.close().unwrap();
            rg.close().unwrap();
        }
        w.close().unwrap();
    }

    #[test]
    fn parquet_reads_the_text_column_across_row_groups_and_names_bad_rows() {
        let dir = crate::testdir::tempdir().unwrap();
        let p = dir.path().join("a.parquet");
        write_parquet(&p, &[Some("one"), Some("two"), Some("three")], 2, false);
        let d =
            Documents::open(&p, Format::Parquet, "text", "data.text_field", "data.path").unwrap();
        let docs: Vec<Document> = d.map(|r| r.unwrap()).collect();
        let got: Vec<(&str, At)> = docs.iter().map(|d| (d.text().unwrap(), d.at)).collect();
        assert_eq!(
            got,
            [
                ("one", At::Row { group: 0, row: 0 }),
                ("two", At::Row { group: 0, row: 1 }),
                ("three", At::Row { group: 1, row: 0 })
            ]
        );
        let nulls = dir.path().join("nulls.parquet");
        write_parquet(&nulls, &[Some("a"), Some("b"), None], 2, false);
        let d = Documents::open(
            &nulls,
            Format::Parquet,
            "text",
            "data.text_field",
            "data.path",
        )
        .unwrap();
        let e = texts(d).unwrap_err();
        assert!(
            e.contains("row group 1, row 0: `text` (data.text_field) is null"),
            "{e}"
        );
        let e = Documents::open(&p, Format::Parquet, "body", "data.text_field", "data.path")
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("no column `body`") && e.contains("`text`, `id`"),
            "{e}"
        );
        let ints = dir.path().join("ints.parquet");
        write_parquet(&ints, &[Some("x")], 1, true);
        let e = Documents::open(
            &ints,
            Format::Parquet,
            "text",
            "data.text_field",
            "data.path",
        )
        .err()
        .unwrap()
        .to_string();
        assert!(
            e.contains("column `text` (data.text_field) is INT64, not a string"),
            "{e}"
        );
        let junk = dir.path().join("junk.parquet");
        std::fs::write(&junk, "{\"text\": 1}\n").unwrap();
        let e = Documents::open(
            &junk,
            Format::Parquet,
            "text",
            "data.text_field",
            "data.path",
        )
        .err()
        .unwrap()
        .to_string();
        assert!(
            e.contains("junk.parquet: not a readable parquet file"),
            "{e}"
        );
    }
}

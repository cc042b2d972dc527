//! Chat templates (`data.format = "messages"`): a conversation rendered as transformers'
//! `apply_chat_template(messages, tokenize=True)` renders it (Jinja through `minijinja`, with
//! jinja2's `trim_blocks` and `lstrip_blocks`, loop controls, Python's string methods, and the
//! globals transformers adds: `raise_exception`, `strftime_now`, `namespace`, a `tojson` that
//! writes as Python's `json.dumps`), then tokenized without the tokenizer's own special tokens
//! (the template writes them).
//!
//! The loss is on the assistant's turns only. A template that marks them with
//! `{% generation %} ... {% endgeneration %}` (transformers' `return_assistant_tokens_mask`)
//! trains exactly the tokens that overlap those spans, as transformers' `assistant_masks` does.
//! Without the tags, an assistant turn's tokens are those that rendering the conversation up to
//! and including the turn adds to rendering it up to the turn before with the generation prompt
//! (the assistant's header is the prompt's; its text and end of turn are trained). The
//! template is `data.chat_template`, else `chat_template.jinja` beside the tokenizer
//! (transformers 5 writes it there), else the `chat_template` of its tokenizer_config.json.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};

use super::documents::NO_LOSS;
use super::tokenizer::Tokenizer;

/// Where a generation span opens and closes in a rendering (Unicode noncharacters: no text
/// that is interchanged holds them, and a conversation that does is refused).
const OPEN: char = '\u{FDD0}';
const CLOSE: char = '\u{FDD1}';

/// A chat template, ready to render.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Where it came from, for messages: a file, or a file's key.
    pub origin: String,
    /// Whether it marks the assistant's turns with `{% generation %}`.
    pub generation: bool,
    /// The special tokens transformers passes to a template (`bos_token`, `eos_token`, ...).
    specials: BTreeMap<String, String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ChatTemplate({})", self.origin)
    }
}

impl ChatTemplate {
    /// The template of `source` (from `origin`), with the special tokens `specials`.
    pub fn new(
        source: &str,
        origin: String,
        specials: BTreeMap<String, String>,
    ) -> Result<ChatTemplate, String> {
        let (source, generation) = generation_tags(source);
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_filter("kiln_generation", |body: String| {
            format!("{OPEN}{body}{CLOSE}")
        });
        env.add_function(
            "raise_exception",
            |message: String| -> Result<Value, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_function("strftime_now", |format: String| strftime_now(&format));
        env.add_template_owned(origin.clone(), source)
            .map_err(|e| format!("{origin}: not a template kiln can read: {}", describe(&e)))?;
        Ok(ChatTemplate {
            env,
            origin,
            generation,
            specials,
        })
    }

    /// The template `data.chat_template` names (a Jinja file), else the one that came with
    /// `tokenizer` (a tokenizer.json's directory); `None` where there is none.
    pub fn find(
        file: Option<&Path>,
        tokenizer: &Tokenizer,
    ) -> Result<Option<ChatTemplate>, String> {
        let dir = match tokenizer {
            Tokenizer::HuggingFace { path, .. } => path.parent().map(Path::to_path_buf),
            _ => None,
        };
        let specials = dir.as_deref().map(special_tokens).unwrap_or_default();
        if let Some(f) = file {
            let source = std::fs::read_to_string(f)
                .map_err(|e| format!("{} (data.chat_template): {e}", f.display()))?;
            return ChatTemplate::new(
                &source,
                format!("{} (data.chat_template)", f.display()),
                specials,
            )
            .map(Some);
        }
        let Some(dir) = dir else {
            return Ok(None);
        };
        let jinja = dir.join("chat_template.jinja");
        if jinja.is_file() {
            let source =
                std::fs::read_to_string(&jinja).map_err(|e| format!("{}: {e}", jinja.display()))?;
            return ChatTemplate::new(&source, jinja.display().to_string(), specials).map(Some);
        }
        let config = dir.join("tokenizer_config.json");
        let Ok(bytes) = std::fs::read(&config) else {
            return Ok(None);
        };
        let v: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| format!("{}: not JSON ({e})", config.display()))?;
        let source = match &v["chat_template"] {
            serde_json::Value::String(s) => s.clone(),
            // a list of named templates: the default one
            serde_json::Value::Array(list) => match list
                .iter()
                .find(|t| t["name"] == "default")
                .and_then(|t| t["template"].as_str())
            {
                Some(s) => s.to_string(),
                None => return Ok(None),
            },
            _ => return Ok(None),
        };
        let origin = format!("the `chat_template` of {}", config.display());
        ChatTemplate::new(&source, origin, specials).map(Some)
    }

    /// `messages` rendered (with the generation prompt where `prompt`), and the byte ranges of
    /// the rendering that `{% generation %}` spans.
    pub fn render(
        &self,
        messages: &[serde_json::Value],
        prompt: bool,
    ) -> Result<(String, Vec<Range<usize>>), String> {
        if self.generation {
            let text = serde_json::to_string(messages).unwrap_or_default();
            if let Some(c) = text.chars().find(|&c| c == OPEN || c == CLOSE) {
                return Err(format!(
                    "the conversation holds U+{:04X}, a Unicode noncharacter kiln marks the assistant's turns with; remove it from the record",
                    u32::from(c)
                ));
            }
        }
        let messages = normalize(messages);
        let mut ctx: BTreeMap<String, Value> = self
            .specials
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        ctx.insert("messages".into(), Value::from_serialize(&messages));
        ctx.insert("add_generation_prompt".into(), Value::from(prompt));
        ctx.insert("tools".into(), Value::from(()));
        ctx.insert("documents".into(), Value::from(()));
        let t = self
            .env
            .get_template(&self.origin)
            .map_err(|e| format!("{}: {}", self.origin, describe(&e)))?;
        let out = t.render(ctx).map_err(|e| {
            format!(
                "the chat template ({}) cannot render this conversation: {}",
                self.origin,
                describe(&e)
            )
        })?;
        if !self.generation {
            return Ok((out, Vec::new()));
        }
        let mut text = String::with_capacity(out.len());
        let mut spans = Vec::new();
        let mut open = None;
        for c in out.chars() {
            match c {
                OPEN if open.is_none() => open = Some(text.len()),
                CLOSE if open.is_some() => {
                    spans.extend(open.take().map(|s| s..text.len()));
                }
                OPEN | CLOSE => {
                    return Err(format!(
                        "the chat template ({}) nests `{{% generation %}}` blocks",
                        self.origin
                    ))
                }
                c => text.push(c),
            }
        }
        Ok((text, spans))
    }

    /// A conversation's ids, the tokens the loss does not predict marked `NO_LOSS` (all are
    /// predicted with `train_on_prompt`).
    pub fn encode(
        &self,
        messages: &[serde_json::Value],
        tokenizer: &Tokenizer,
        train_on_prompt: bool,
    ) -> Result<Vec<u32>, String> {
        let (text, spans) = if self.generation || train_on_prompt {
            self.render(messages, false)?
        } else {
            self.assistant_spans(messages)?
        };
        let (mut ids, offsets) = tokenizer.encode_offsets(&text)?;
        if train_on_prompt {
            return Ok(ids);
        }
        // as transformers' `assistant_masks`: each token that overlaps a span
        let mut mask = vec![false; ids.len()];
        let mut k = 0;
        for (i, &(start, end)) in offsets.iter().enumerate() {
            while k < spans.len() && start >= spans[k].end {
                k += 1;
            }
            if k == spans.len() {
                break;
            }
            if end > spans[k].start {
                mask[i] = true;
            }
        }
        if !mask.contains(&true) && messages.iter().any(|m| m["role"] == "assistant") {
            return Err(format!(
                "the chat template ({}) marks no token of this conversation's assistant turns as trained; check its `{{% generation %}}` blocks with `kiln data preview`, or set `data.train_on_prompt = true`",
                self.origin
            ));
        }
        for (t, trained) in ids.iter_mut().zip(mask) {
            if !trained {
                *t |= NO_LOSS;
            }
        }
        Ok(ids)
    }

    /// The id that ends an assistant's turn: the first token after the assistant's text in a
    /// rendering of a short conversation, where it is one of the tokenizer's special tokens
    /// (ChatML's `<|im_end|>`, Llama 3's `<|eot_id|>`).
    pub fn end_of_turn(&self, tokenizer: &Tokenizer) -> Option<u32> {
        let probe = [
            serde_json::json!({"role": "user", "content": "kiln"}),
            serde_json::json!({"role": "assistant", "content": "kiln"}),
        ];
        let (text, _) = self.render(&probe, false).ok()?;
        let at = text.rfind("kiln")? + "kiln".len();
        let (ids, _) = tokenizer.encode_offsets(&text[at..]).ok()?;
        let first = *ids.first()?;
        tokenizer.is_special(first).then_some(first)
    }

    /// A template without generation tags: the rendering of the whole conversation, and the
    /// byte ranges each assistant turn adds to the rendering of the turns before it with the
    /// generation prompt (or without, where that is not how the conversation goes on).
    fn assistant_spans(
        &self,
        messages: &[serde_json::Value],
    ) -> Result<(String, Vec<Range<usize>>), String> {
        let (full, _) = self.render(messages, false)?;
        let mut spans = Vec::new();
        for (k, m) in messages.iter().enumerate() {
            if m["role"] != "assistant" {
                continue;
            }
            let (upto, _) = self.render(&messages[..=k], false)?;
            let before = if k == 0 {
                // (the template's preamble, where it renders one for no messages)
                match self.render(&[], true) {
                    Ok((p, _)) if upto.starts_with(&p) => p,
                    _ => String::new(),
                }
            } else {
                let (p, _) = self.render(&messages[..k], true)?;
                if upto.starts_with(&p) {
                    p
                } else {
                    self.render(&messages[..k], false)?.0
                }
            };
            if !upto.starts_with(&before) || !full.starts_with(&upto) {
                return Err(format!(
                    "the chat template ({}) renders the start of a conversation differently once it goes on (message {k}), so kiln cannot tell the assistant's tokens; mark them with `{{% generation %}} ... {{% endgeneration %}}` in the template (`data.chat_template`), or set `data.train_on_prompt = true`",
                    self.origin
                ));
            }
            spans.push(before.len()..upto.len());
        }
        Ok((full, spans))
    }
}

/// `source` with `{% generation %}` / `{% endgeneration %}` turned into a filter block that
/// marks its output (same whitespace control), and whether it had any.
fn generation_tags(source: &str) -> (String, bool) {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    let mut found = false;
    while let Some(i) = [rest.find("{%"), rest.find("{#")]
        .into_iter()
        .flatten()
        .min()
    {
        let comment = rest.find("{#");
        out.push_str(&rest[..i]);
        if comment == Some(i) {
            // a comment is copied as it is
            let end = rest[i..].find("#}").map_or(rest.len(), |e| i + e + 2);
            out.push_str(&rest[i..end]);
            rest = &rest[end..];
            continue;
        }
        let tag = &rest[i..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            rest = "";
            break;
        };
        let inner = &tag[2..end];
        let (left, inner) = match inner.chars().next() {
            Some(c @ ('-' | '+')) => (c.to_string(), &inner[1..]),
            _ => (String::new(), inner),
        };
        let (inner, right) = match inner.chars().last() {
            Some(c @ ('-' | '+')) => (&inner[..inner.len() - 1], c.to_string()),
            _ => (inner, String::new()),
        };
        match inner.trim() {
            // (a `with` block: the body has a scope of its own, as jinja2's CallBlock does)
            "generation" => {
                found = true;
                out.push_str(&format!(
                    "{{%{left} filter kiln_generation %}}{{% with {right}%}}"
                ));
            }
            "endgeneration" => {
                out.push_str(&format!("{{%{left} endwith %}}{{% endfilter {right}%}}"))
            }
            "raw" => {
                // a raw block is copied as it is, to its end
                let body = &tag[end + 2..];
                let stop = body
                    .find("endraw")
                    .and_then(|e| body[e..].find("%}").map(|c| e + c + 2))
                    .unwrap_or(body.len());
                out.push_str(&tag[..end + 2]);
                out.push_str(&body[..stop]);
                rest = &body[stop..];
                continue;
            }
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    (out, found)
}

/// Each message without its keys whose value is null, and its reasoning under the names
/// templates read (`reasoning_content`, `thinking`), as transformers passes them.
fn normalize(messages: &[serde_json::Value]) -> Vec<serde_json::Value> {
    messages
        .iter()
        .map(|m| {
            let serde_json::Value::Object(o) = m else {
                return m.clone();
            };
            let mut o: serde_json::Map<String, serde_json::Value> = o
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let reasoning = ["reasoning_content", "thinking", "reasoning"]
                .iter()
                .find_map(|k| o.get(*k).cloned());
            if let Some(r) = reasoning {
                o.entry("thinking").or_insert_with(|| r.clone());
                o.insert("reasoning_content".into(), r);
            }
            serde_json::Value::Object(o)
        })
        .collect()
}

/// The special tokens of a tokenizer's directory (tokenizer_config.json, then
/// special_tokens_map.json): each `*_token` that is a string or an added token's `content`.
fn special_tokens(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for file in ["special_tokens_map.json", "tokenizer_config.json"] {
        let Some(serde_json::Value::Object(o)) = read_json(&dir.join(file)) else {
            continue;
        };
        for (k, v) in o {
            if !k.ends_with("_token") {
                continue;
            }
            let s = match &v {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Object(t) => t
                    .get("content")
                    .and_then(|c| c.as_str())
                    .map(str::to_string),
                _ => None,
            };
            if let Some(s) = s {
                out.insert(k, s);
            }
        }
    }
    out
}

fn read_json(p: &Path) -> Option<serde_json::Value> {
    let bytes = std::fs::read(p).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// A minijinja error in a line: its kind, detail and the template's line.
fn describe(e: &Error) -> String {
    let mut s = e.to_string();
    if let Some(line) = e.line() {
        if !s.contains("line") && !s.contains("(in ") {
            s.push_str(&format!(" (line {line})"));
        }
    }
    crate::ui::printable(&crate::config::brief(&s.replace('\n', "\\n"), 400)).into_owned()
}

/// transformers' `tojson`: Python's `json.dumps(x, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)` (not minijinja's, which escapes HTML).
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(match v.as_str() {
            Some(s) => s.to_string(),
            None => " ".repeat(i64::try_from(v).unwrap_or(0).max(0) as usize),
        }),
    };
    let (item, key) = match &separators {
        Some(s) if s.len() == 2 => (s[0].clone(), s[1].clone()),
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let v: serde_json::Value = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let mut out = String::new();
    let o = Dumps {
        indent,
        item,
        key,
        sort: sort_keys.unwrap_or(false),
        ascii: ascii.unwrap_or(false),
    };
    dumps(&v, &mut out, &o, 0);
    Ok(Value::from_safe_string(out))
}

struct Dumps {
    indent: Option<String>,
    item: String,
    key: String,
    sort: bool,
    /// `ensure_ascii`: characters past ASCII as `\uXXXX` escapes.
    ascii: bool,
}

/// A JSON string as Python's `json.dumps` writes it.
fn py_string(s: &str, ascii: bool) -> String {
    let json = serde_json::Value::String(s.to_string()).to_string();
    if !ascii {
        return json;
    }
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    out
}

/// A float as Python's `repr` writes it: the shortest digits, positional for exponents in
/// [-4, 16), else `d.ddde+XX`.
fn py_float(f: f64) -> String {
    if !f.is_finite() {
        return if f.is_nan() {
            "NaN".into()
        } else if f > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    let e = format!("{f:e}");
    let (mantissa, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let body = if exp >= 0 {
            let point = exp as usize + 1;
            let padded = format!("{digits:0<point$}");
            let (int, frac) = padded.split_at(point);
            format!("{int}.{}", if frac.is_empty() { "0" } else { frac })
        } else {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        };
        format!("{sign}{body}")
    } else {
        let m = if digits.len() > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits
        };
        format!(
            "{sign}{m}e{}{:02}",
            if exp < 0 { '-' } else { '+' },
            exp.abs()
        )
    }
}

fn dumps(v: &serde_json::Value, out: &mut String, o: &Dumps, depth: usize) {
    let newline = |out: &mut String, depth: usize| {
        if let Some(ind) = &o.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(ind);
            }
        }
    };
    match v {
        serde_json::Value::Array(a) if !a.is_empty() => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(&o.item);
                }
                newline(out, depth + 1);
                dumps(x, out, o, depth + 1);
            }
            newline(out, depth);
            out.push(']');
        }
        serde_json::Value::Object(m) if !m.is_empty() => {
            out.push('{');
            let mut entries: Vec<(&String, &serde_json::Value)> = m.iter().collect();
            if o.sort {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            for (i, (k, x)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(&o.item);
                }
                newline(out, depth + 1);
                out.push_str(&py_string(k, o.ascii));
                out.push_str(&o.key);
                dumps(x, out, o, depth + 1);
            }
            newline(out, depth);
            out.push('}');
        }
        serde_json::Value::Number(n) if n.is_f64() => {
            out.push_str(&py_float(n.as_f64().unwrap_or(0.0)))
        }
        serde_json::Value::String(s) => out.push_str(&py_string(s, o.ascii)),
        other => out.push_str(&other.to_string()),
    }
}

/// transformers' `strftime_now(format)`: the local time now (Python's `datetime.now()`) as
/// `format` says (the common directives: `%d %m %Y %y %H %M %S %b %B %a %A %j %p %I %%`).
fn strftime_now(format: &str) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    // the local zone's offset now (libc's localtime_r, which reads TZ)
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let t: libc::time_t = secs as libc::time_t;
    // SAFETY: both pointers are to live locals; localtime_r writes only `tm`
    let offset = if unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
        0
    } else {
        tm.tm_gmtoff as i64
    };
    strftime(format, secs + offset)
}

fn strftime(format: &str, secs: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = secs.div_euclid(86_400);
    let [y, m, d, h, mi, s] = crate::ui::civil(secs);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let before = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334][(m - 1) as usize];
    let yday = before + d + i64::from(leap && m > 2);
    let wday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let month = MONTHS[(m - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y % 100)),
            Some('H') => out.push_str(&format!("{h:02}")),
            Some('I') => out.push_str(&format!("{:02}", (h + 11) % 12 + 1)),
            Some('p') => out.push_str(if h < 12 { "AM" } else { "PM" }),
            Some('M') => out.push_str(&format!("{mi:02}")),
            Some('S') => out.push_str(&format!("{s:02}")),
            Some('b') => out.push_str(&month[..3]),
            Some('B') => out.push_str(month),
            Some('a') => out.push_str(&DAYS[wday][..3]),
            Some('A') => out.push_str(DAYS[wday]),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// The file a `data.chat_template` value names, relative to the file that set it.
pub fn template_file(r: &crate::config::Resolved) -> Option<PathBuf> {
    r.config
        .data
        .chat_template
        .as_ref()
        .map(|f| r.path_of("data.chat_template", f))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    fn conv() -> Vec<serde_json::Value> {
        serde_json::from_str(
            r#"[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Bye."}]"#,
        )
        .unwrap()
    }

    #[test]
    fn generation_tags_mark_the_assistants_text_and_the_same_spans_come_without_them() {
        let t = ChatTemplate::new(CHATML, "chatml".into(), BTreeMap::new()).unwrap();
        assert!(t.generation);
        let (text, spans) = t.render(&conv(), false).unwrap();
        let marked: Vec<&str> = spans.iter().map(|s| &text[s.clone()]).collect();
        assert_eq!(marked, ["Hello!<|im_end|>", "Bye.<|im_end|>"]);
        assert!(text.starts_with("<|im_start|>system\nBe brief.<|im_end|>\n"));
        // the same template without the tags: each assistant turn after the generation prompt
        let plain = CHATML
            .replace("{% generation %}", "")
            .replace("{% endgeneration %}", "");
        let p = ChatTemplate::new(&plain, "plain".into(), BTreeMap::new()).unwrap();
        assert!(!p.generation);
        let (text2, spans2) = p.assistant_spans(&conv()).unwrap();
        assert_eq!(text2, text);
        let marked2: Vec<&str> = spans2.iter().map(|s| &text2[s.clone()]).collect();
        // (the newline after each turn is the next turn's start)
        assert_eq!(marked2, ["Hello!<|im_end|>\n", "Bye.<|im_end|>\n"]);
        // bytes: the marks become NO_LOSS on every other token
        let ids = t.encode(&conv(), &Tokenizer::Bytes, false).unwrap();
        let trained: String = ids
            .iter()
            .filter(|&&i| i & NO_LOSS == 0)
            .map(|&i| i as u8 as char)
            .collect();
        assert_eq!(trained, "Hello!<|im_end|>Bye.<|im_end|>");
    }

    #[test]
    fn templates_call_what_real_ones_call() {
        let src = r#"{%- set ns = namespace(sys='') -%}
{%- for m in messages -%}
  {%- if m.role == 'system' %}{% set ns.sys = m.content.strip() %}{% continue %}{% endif -%}
  {%- if m.role not in ['user', 'assistant'] %}{{ raise_exception('unknown role ' + m.role) }}{% endif -%}
  [{{ m.role | upper }}{% if loop.index0 == 1 and ns.sys %} ({{ ns.sys }}){% endif %}] {{ m.content }}{{ eos_token if m.role == 'assistant' }}
{% endfor -%}
{{ {'k': [1, 2.0, "é"]} | tojson }}|{{ strftime_now('%Y') | length }}"#;
        let specials = BTreeMap::from([("eos_token".to_string(), "</s>".to_string())]);
        let t = ChatTemplate::new(src, "t".into(), specials.clone()).unwrap();
        let (text, _) = t.render(&conv()[..3], false).unwrap();
        assert_eq!(
            text,
            "[USER (Be brief.)] Hi\n[ASSISTANT] Hello!</s>\n{\"k\": [1, 2.0, \"é\"]}|4"
        );
        let bad: Vec<serde_json::Value> =
            serde_json::from_str(r#"[{"role": "tool", "content": "x"}]"#).unwrap();
        let e = t.render(&bad, false).unwrap_err();
        assert!(e.contains("unknown role tool"), "{e}");
        let e = ChatTemplate::new("{% for %}", "bad.jinja".into(), specials).unwrap_err();
        assert!(
            e.starts_with("bad.jinja: not a template kiln can read"),
            "{e}"
        );
    }

    #[test]
    fn floats_and_strings_are_written_as_pythons_json_dumps() {
        let cases = [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (1e15, "1000000000000000.0"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (-2.5e-7, "-2.5e-07"),
            (123.456, "123.456"),
        ];
        for (f, want) in cases {
            assert_eq!(py_float(f), want, "{f}");
        }
        assert_eq!(py_string("é\"", true), "\"\\u00e9\\\"\"");
        assert_eq!(py_string("é", false), "\"é\"");
    }

    #[test]
    fn strftime_writes_pythons_directives() {
        // 2024-02-29 13:05:09 UTC, a Thursday
        let t = 1_709_211_909;
        assert_eq!(
            strftime("%d %b %Y %H:%M:%S %A %j %I%p %%", t),
            "29 Feb 2024 13:05:09 Thursday 060 01PM %"
        );
    }
}

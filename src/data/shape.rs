//! What a record of jsonl or parquet holds (`data.format`): a text, a prompt and its
//! completion, or a conversation (`records.rs` reads them).

/// What a record holds (`data.format`): a text (the document), a prompt and its completion,
/// or a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shape {
    /// The text field `field` (named in messages by `key`: `data.text_field`, or `data.mix`).
    Text { field: String, key: &'static str },
    /// The string fields `prompt` and `completion` (TRL's prompt-completion datasets).
    PromptCompletion,
    /// The field `field` (`data.messages_field`): a list of messages, each an object with a
    /// string `role` (TRL's conversational datasets).
    Messages { field: String },
}

impl Shape {
    /// The fields (columns) a record of this shape is read from.
    pub fn fields(&self) -> Vec<&str> {
        match self {
            Shape::Text { field, .. } | Shape::Messages { field } => vec![field],
            Shape::PromptCompletion => vec!["prompt", "completion"],
        }
    }

    /// A record's content from its fields, `take` handing out each field's value (`None` where
    /// the record has none): jsonl's object and parquet's row alike.
    pub(super) fn content(
        &self,
        mut take: impl FnMut(&str) -> Option<serde_json::Value>,
    ) -> Result<Content, String> {
        let key = self.key();
        let mut string = |field: &str| match take(field) {
            Some(serde_json::Value::String(text)) => Ok(text),
            Some(other) => Err(format!(
                "`{field}` ({key}) is {}, not a string",
                json_kind(&other)
            )),
            None => Err(format!("`{field}` ({key}) is missing")),
        };
        match self {
            Shape::Text { field, .. } => string(field).map(Content::Text),
            Shape::PromptCompletion => Ok(Content::PromptCompletion {
                prompt: string("prompt")?,
                completion: string("completion")?,
            }),
            Shape::Messages { field } => {
                messages(take(field).unwrap_or_default(), field).map(Content::Messages)
            }
        }
    }

    /// The config key that names a field, for messages.
    pub(super) fn key(&self) -> &'static str {
        match self {
            Shape::Text { key, .. } => key,
            Shape::PromptCompletion => "data.format",
            Shape::Messages { .. } => "data.messages_field",
        }
    }
}

/// One record's content.
#[derive(Debug, Clone, PartialEq)]
pub enum Content {
    Text(String),
    PromptCompletion {
        prompt: String,
        completion: String,
    },
    /// The messages, as the record has them (each an object with a string `role`).
    Messages(Vec<serde_json::Value>),
}

/// What kind of JSON value `v` is, for a message.
pub(super) fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// A conversation (the value of `field`): a list of objects, each with a string `role`.
fn messages(v: serde_json::Value, field: &str) -> Result<Vec<serde_json::Value>, String> {
    let serde_json::Value::Array(list) = v else {
        return Err(format!(
            "`{field}` (data.messages_field) is {}, not a list of messages",
            json_kind(&v)
        ));
    };
    if list.is_empty() {
        return Err(format!("`{field}` (data.messages_field) is an empty list: a conversation has at least one message"));
    }
    for (i, m) in list.iter().enumerate() {
        match m.get("role") {
            Some(serde_json::Value::String(_)) => {}
            Some(other) => {
                return Err(format!(
                    "message {i} of `{field}` has a `role` that is {}, not a string",
                    json_kind(other)
                ))
            }
            None if m.is_object() => {
                return Err(format!(
                "message {i} of `{field}` has no `role` (\"system\", \"user\", \"assistant\", ...)"
            ))
            }
            None => {
                return Err(format!(
                    "message {i} of `{field}` is {}, not an object with a `role` and a `content`",
                    json_kind(m)
                ))
            }
        }
    }
    Ok(list)
}

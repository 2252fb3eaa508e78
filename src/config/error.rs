//! Configuration errors and how they are said: the key, where it was set, the problem in an
//! operator's words.

/// A configuration that cannot be loaded or does not make sense.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file, an environment variable or a flag has a wrong key or value: one line per
    /// problem, naming the key and where it was set (see [`describe`]).
    #[error("configuration: {0}")]
    Load(String),
    /// Values that parse but contradict each other or are out of range.
    #[error("configuration: {0}")]
    Invalid(String),
}

/// Says what is wrong with the configuration, once per problem: the key as written in the file
/// (`sse.heartbeat`), where the value came from (the file, or the environment variable's
/// name), and the problem. figment's own message names environment keys in upper case with
/// dots and the file's with its profile.
pub(super) fn describe(error: figment::Error) -> String {
    error
        .into_iter()
        .map(|e| {
            let key = e.path.join(".").to_ascii_lowercase();
            let origin = match e.metadata.as_ref().map(|md| (&md.source, &md.name)) {
                Some((Some(figment::Source::File(path)), _)) => format!(" in {}", path.display()),
                Some((_, name)) if name.contains("environment") => {
                    format!(" in AGUI_{}", key.replace('.', "__").to_ascii_uppercase())
                }
                Some((_, name)) => format!(" in {name}"),
                None => String::new(),
            };
            match &e.kind {
                figment::error::Kind::UnknownField(field, known) => {
                    let table = match key.rsplit_once('.') {
                        Some((table, _)) => format!("[{table}]"),
                        None => "the top level".into(),
                    };
                    format!(
                        "unknown key {field:?}{origin}; {table} takes {}",
                        known.join(", ")
                    )
                }
                kind => {
                    let kind = in_words(kind);
                    if key.is_empty() {
                        format!("{kind}{origin}")
                    } else {
                        format!("{key}{origin}: {kind}")
                    }
                }
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// figment's message for `kind`, with serde's names of Rust's number types (`expected usize`)
/// said as an operator reads them (`expected a non-negative integer`).
fn in_words(kind: &figment::error::Kind) -> String {
    use figment::error::Kind;
    let word = |expected: &str| {
        match expected {
            "usize" | "u64" | "u32" | "u16" | "u8" => "a non-negative integer",
            "isize" | "i64" | "i32" | "i16" | "i8" => "an integer",
            "f64" | "f32" => "a number",
            other => other,
        }
        .to_string()
    };
    match kind {
        Kind::InvalidType(actual, expected) => {
            Kind::InvalidType(actual.clone(), word(expected)).to_string()
        }
        Kind::InvalidValue(actual, expected) => {
            Kind::InvalidValue(actual.clone(), word(expected)).to_string()
        }
        kind => kind.to_string(),
    }
}

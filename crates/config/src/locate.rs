//! Where in a config file something is: the line, column and key (`proxy.max_connections`,
//! `backend[1].address`) of a TOML error's span, or the line of a key a validation names.
//! Used for the errors of [`crate::Config::parse`] and [`crate::Config::load`], so that a
//! refused file (at start or at a reload) says which line and key to fix.

use std::fmt;
use std::ops::Range;
use toml_edit::{ImDocument, Item, Value};

/// A place in a config file. Each part is known or not: a value from a password file has
/// a key but no line; a file that is not TOML has a line but may have no key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Location {
    /// 1-based.
    pub line: Option<usize>,
    /// 1-based, in characters.
    pub column: Option<usize>,
    /// The dotted key, arrays of tables by index: `backend[1].address`.
    pub key: Option<String>,
}

impl fmt::Display for Location {
    /// `, line 3, column 19, key proxy.max_connections` (the parts that are known).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(line) = self.line {
            write!(f, ", line {line}")?;
            if let Some(column) = self.column {
                write!(f, ", column {column}")?;
            }
        }
        if let Some(key) = &self.key {
            write!(f, ", key {key}")?;
        }
        Ok(())
    }
}

/// One key of the document with where its name and its value are.
struct Entry {
    path: String,
    key: Option<Range<usize>>,
    value: Option<Range<usize>>,
}

fn entries(text: &str) -> Vec<Entry> {
    let mut out = Vec::new();
    if let Ok(doc) = ImDocument::parse(text) {
        walk_table(doc.as_table(), "", &mut out);
    }
    out
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

fn walk_table(table: &toml_edit::Table, prefix: &str, out: &mut Vec<Entry>) {
    for (name, item) in table.iter() {
        let path = join(prefix, name);
        let key = table.key(name).and_then(|k| k.span());
        walk_item(item, path, key, out);
    }
}

fn walk_item(item: &Item, path: String, key: Option<Range<usize>>, out: &mut Vec<Entry>) {
    match item {
        Item::None => {}
        Item::Value(v) => walk_value(v, path, key, out),
        Item::Table(t) => {
            out.push(Entry {
                path: path.clone(),
                key,
                value: t.span(),
            });
            walk_table(t, &path, out);
        }
        Item::ArrayOfTables(a) => {
            for (i, t) in a.iter().enumerate() {
                let path = format!("{path}[{i}]");
                out.push(Entry {
                    path: path.clone(),
                    key: None,
                    value: t.span(),
                });
                walk_table(t, &path, out);
            }
        }
    }
}

fn walk_value(value: &Value, path: String, key: Option<Range<usize>>, out: &mut Vec<Entry>) {
    out.push(Entry {
        path: path.clone(),
        key,
        value: value.span(),
    });
    if let Value::InlineTable(t) = value {
        for (name, v) in t.iter() {
            let key = t.key(name).and_then(|k| k.span());
            walk_value(v, join(&path, name), key, out);
        }
    }
}

/// Line and column (1-based) of byte `offset`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before.get(line_start..).map_or(0, |s| s.chars().count()) + 1;
    (line, column)
}

fn contains(range: &Option<Range<usize>>, at: usize) -> Option<usize> {
    range
        .as_ref()
        .filter(|r| r.start <= at && at < r.end.max(r.start + 1))
        .map(|r| r.end - r.start)
}

/// Where a TOML error's `span` is: its line and column, and the innermost key whose name or
/// value holds it. A `missing field` message adds the field to the table's key.
pub fn of_span(text: &str, span: Range<usize>, message: &str) -> Location {
    let (line, column) = line_column(text, span.start);
    let key = entries(text)
        .into_iter()
        .filter_map(|e| {
            let size = [contains(&e.key, span.start), contains(&e.value, span.start)]
                .into_iter()
                .flatten()
                .min()?;
            Some((size, e.path))
        })
        .min_by_key(|(size, _)| *size)
        .map(|(_, path)| path);
    let missing = message
        .strip_prefix("missing field `")
        .and_then(|m| m.split('`').next());
    let key = match (key, missing) {
        (Some(table), Some(field)) => Some(join(&table, field)),
        (None, Some(field)) => Some(field.to_string()),
        (key, None) => key,
    };
    Location {
        line: Some(line),
        column: Some(column),
        key,
    }
}

/// Where `key` (as [`Location::key`] writes it) is in `text`; only the key when the file
/// does not have it (a default, or a value from a password file).
pub fn of_key(text: &str, key: &str) -> Location {
    let found = entries(text)
        .into_iter()
        .find(|e| e.path == key)
        .and_then(|e| e.key.or(e.value));
    let line = found.map(|r| line_column(text, r.start).0);
    Location {
        line,
        column: None,
        key: Some(key.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_name_their_line_and_key() {
        let text = "[proxy]\nlisten = \"x\"\nmax_connections = \"many\"\n\n[[backend]]\nname = \"a\"\n\n[[backend]]\nname = \"b\"\naddress = 3\n[serverless]\ndriver = { kind = \"process\", command = 3 }\n";
        let at = |needle: &str| {
            let start = text.find(needle).unwrap();
            start..start + needle.len()
        };
        let loc = of_span(text, at("\"many\""), "invalid type");
        assert_eq!(loc.line, Some(3));
        assert_eq!(loc.column, Some(19));
        assert_eq!(loc.key.as_deref(), Some("proxy.max_connections"));
        let loc = of_span(text, at("address = 3"), "unknown field `address`");
        assert_eq!(loc.key.as_deref(), Some("backend[1].address"));
        assert_eq!(loc.line, Some(10));
        let loc = of_span(
            text,
            at("[[backend]]\nname = \"a\""),
            "missing field `address`",
        );
        assert_eq!(loc.key.as_deref(), Some("backend[0].address"));
        assert_eq!(loc.line, Some(5));
        let loc = of_span(text, at("3 }"), "invalid type");
        assert_eq!(loc.key.as_deref(), Some("serverless.driver.command"));
        assert_eq!(
            loc.to_string(),
            ", line 12, column 40, key serverless.driver.command"
        );
    }

    #[test]
    fn keys_are_found_by_name() {
        let text = "[proxy]\nmax_connections = 0\n[split]\ncausal_wait_ms = 0\n";
        assert_eq!(of_key(text, "split.causal_wait_ms").line, Some(4));
        assert_eq!(of_key(text, "split").line, Some(3));
        let absent = of_key(text, "ha.repl_password");
        assert_eq!(
            (absent.line, absent.key.as_deref()),
            (None, Some("ha.repl_password"))
        );
        // Not TOML: no line, still the key.
        assert_eq!(of_key("[x", "proxy").line, None);
    }
}

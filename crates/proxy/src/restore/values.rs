//! Captured user variables: their exact typed values, how each is written back, and how
//! one is decoded from a binary-protocol row.

use super::types::is_decimal;
use super::RestoreError;
use holdfast_sql::quote::{hex, identifier};
use holdfast_wire::binary_row::*;

/// A user variable's value with its exact type. `None` values are typed NULLs.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum UserValue {
    Signed(Option<i64>),
    Unsigned(Option<u64>),
    /// The exact digits as the server prints them (scale kept: `1.10`).
    Decimal(Option<String>),
    Double(Option<f64>),
    /// A string with its character set and collation (`binary` for binary strings).
    Text {
        bytes: Option<Vec<u8>>,
        charset: String,
        collation: String,
    },
}

/// A captured user variable.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct UserVariable {
    /// The name as the server lists it (UTF-8), without `@`.
    pub name: String,
    pub value: UserValue,
}

fn is_plain_name(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

impl UserVariable {
    /// `@\`name\``.
    pub fn reference(&self) -> String {
        format!("@{}", identifier(&self.name))
    }

    /// The expression that gives the variable back its value and type.
    pub fn literal(&self) -> Result<String, RestoreError> {
        let unsupported = |reason: &str| RestoreError::Unsupported {
            item: format!("@{}", self.name),
            reason: reason.into(),
        };
        Ok(match &self.value {
            UserValue::Signed(Some(v)) => v.to_string(),
            UserValue::Signed(None) => "CAST(NULL AS SIGNED)".into(),
            UserValue::Unsigned(Some(v)) => format!("CAST({v} AS UNSIGNED)"),
            UserValue::Unsigned(None) => "CAST(NULL AS UNSIGNED)".into(),
            UserValue::Decimal(Some(d)) => {
                if !is_decimal(d) {
                    return Err(unsupported(&format!("decimal value {d:?} is not a number")));
                }
                if d.contains('.') {
                    d.clone()
                } else {
                    // A literal without a fraction would be an integer.
                    format!("CAST({d} AS DECIMAL(65,0))")
                }
            }
            UserValue::Decimal(None) => "CAST(NULL AS DECIMAL)".into(),
            UserValue::Double(Some(f)) => {
                if !f.is_finite() {
                    return Err(unsupported("the double is not finite"));
                }
                // Rust's `{:e}` is the shortest representation that reads back to the same
                // bits; an exponent makes MariaDB read it as a DOUBLE.
                format!("{f:e}")
            }
            UserValue::Double(None) => "CAST(NULL AS DOUBLE)".into(),
            UserValue::Text {
                bytes,
                charset,
                collation,
            } => {
                if !is_plain_name(charset) || !is_plain_name(collation) {
                    return Err(unsupported(&format!(
                        "unexpected character set {charset:?} / collation {collation:?}"
                    )));
                }
                match bytes {
                    Some(b) if charset.eq_ignore_ascii_case("binary") => {
                        format!("_binary X'{}'", hex(b))
                    }
                    Some(b) => format!("_{charset} X'{}' COLLATE {collation}", hex(b)),
                    None if charset.eq_ignore_ascii_case("binary") => "NULL".into(),
                    None => {
                        format!("CAST(NULL AS CHAR CHARACTER SET {charset}) COLLATE {collation}")
                    }
                }
            }
        })
    }
}

/// Why a binary-protocol value does not fit its column type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    #[error("integer of {0} bytes")]
    IntegerWidth(usize),
    #[error("{0} of wrong size")]
    FloatWidth(&'static str),
}

pub(super) fn decode_user_value(
    col: &ColumnType,
    raw: Option<&[u8]>,
    raw_bytes: Option<&[u8]>,
    charset: Option<String>,
    collation: Option<String>,
) -> Result<UserValue, ValueError> {
    let unsigned = col.is_unsigned();
    let le = |b: &[u8]| -> Result<[u8; 8], ValueError> {
        let mut a = [0u8; 8];
        match b.len() {
            1 | 2 | 4 | 8 => {
                a[..b.len()].copy_from_slice(b);
                // Sign-extend narrower signed integers.
                if !unsigned && b.len() < 8 && b.last().is_some_and(|x| x & 0x80 != 0) {
                    a[b.len()..].fill(0xff);
                }
                Ok(a)
            }
            n => Err(ValueError::IntegerWidth(n)),
        }
    };
    Ok(match col.ty {
        TYPE_TINY | TYPE_SHORT | TYPE_LONG | TYPE_INT24 | TYPE_LONGLONG | TYPE_YEAR => {
            match (raw, unsigned) {
                (Some(b), true) => UserValue::Unsigned(Some(u64::from_le_bytes(le(b)?))),
                (Some(b), false) => UserValue::Signed(Some(i64::from_le_bytes(le(b)?))),
                (None, true) => UserValue::Unsigned(None),
                (None, false) => UserValue::Signed(None),
            }
        }
        TYPE_DOUBLE => UserValue::Double(match raw {
            Some(b) => Some(f64::from_le_bytes(
                b.try_into().map_err(|_| ValueError::FloatWidth("double"))?,
            )),
            None => None,
        }),
        TYPE_FLOAT => UserValue::Double(match raw {
            Some(b) => Some(f64::from(f32::from_le_bytes(
                b.try_into().map_err(|_| ValueError::FloatWidth("float"))?,
            ))),
            None => None,
        }),
        TYPE_DECIMAL | TYPE_NEWDECIMAL => {
            UserValue::Decimal(raw.map(|b| String::from_utf8_lossy(b).into_owned()))
        }
        _ => UserValue::Text {
            bytes: raw_bytes.map(<[u8]>::to_vec),
            charset: charset.unwrap_or_else(|| "binary".into()),
            collation: collation.unwrap_or_else(|| "binary".into()),
        },
    })
}

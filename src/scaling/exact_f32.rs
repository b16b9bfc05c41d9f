//! Serde helpers that store f32 values as their shortest round-trip decimal
//! string (Rust's `{}`: "448", "0.0022321428", "inf", "NaN").
//!
//! Why not plain numbers: JSON has no inf/NaN (serde_json writes `null`), and a
//! decimal that goes through an f64 parser and then to f32 is rounded twice.
//! `str::parse::<f32>` is correctly rounded, so every finite value, +-inf and
//! NaN (payload aside, which the contract ignores) come back bit for bit.

use serde::{Deserialize, Deserializer, Serializer};

/// Parses what [`serialize`] wrote.
fn parse<E: serde::de::Error>(text: &str) -> Result<f32, E> {
    text.parse::<f32>()
        .map_err(|_| E::custom(format!("'{text}' is not an f32 value")))
}

/// Writes one f32 as its shortest round-trip string.
pub fn serialize<S: Serializer>(value: &f32, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(value)
}

/// Reads one f32 written by [`serialize`].
pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f32, D::Error> {
    let text = String::deserialize(deserializer)?;
    parse(&text)
}

/// The same for a `Vec<f32>` (an amax history).
pub mod vec {
    use super::*;

    /// Writes every value as its shortest round-trip string.
    pub fn serialize<S: Serializer>(values: &[f32], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(values.iter().map(|v| v.to_string()))
    }

    /// Reads values written by [`serialize`].
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<f32>, D::Error> {
        let texts = Vec::<String>::deserialize(deserializer)?;
        texts.iter().map(|t| parse::<D::Error>(t)).collect()
    }
}

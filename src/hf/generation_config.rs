//! `generation_config.json`: the token ids that end a generation. `eos_token_id` is one id or,
//! as in Llama 3 (`<|end_of_text|>`, `<|eot_id|>`, ...), a list; a generation stops at any of
//! them as well as at the tokenizer's own end-of-sequence token.

use std::path::Path;

use serde_json::Value;

use super::HfTokenizer;
use crate::error::{Error, Result};

/// `generation_config.json` files above this are refused (published ones are under 1 KiB).
const MAX_GENERATION_CONFIG_BYTES: u64 = 1 << 20;

/// The `eos_token_id` of a generation config's text: one id, a list, or none (absent or null).
fn eos_token_ids(text: &[u8]) -> std::result::Result<Vec<u32>, String> {
    let config: Value = serde_json::from_slice(text).map_err(|err| err.to_string())?;
    let id = |v: &Value| {
        v.as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .ok_or_else(|| format!("eos_token_id entry {v} is not a token id"))
    };
    match config.get("eos_token_id") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(ids)) => ids.iter().map(id).collect(),
        Some(v) => Ok(vec![id(v)?]),
    }
}

/// The ids that end a generation of the model in `dir`: the tokenizer's end-of-sequence token,
/// then every `eos_token_id` of `dir/generation_config.json` (when the file exists), each once.
pub fn stop_ids(dir: &Path, tokenizer: &HfTokenizer) -> Result<Vec<u32>> {
    let mut ids = tokenizer.eos().to_vec();
    let path = dir.join("generation_config.json");
    if path.exists() {
        let text = crate::io::read_regular(&path, MAX_GENERATION_CONFIG_BYTES, "")?;
        let more = eos_token_ids(&text).map_err(|reason| Error::InvalidFile {
            path: path.display().to_string(),
            reason,
        })?;
        for id in more {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eos_token_id_is_one_id_a_list_or_none() {
        assert_eq!(eos_token_ids(br#"{"eos_token_id": 2}"#).unwrap(), [2]);
        let llama3 = br#"{"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]}"#;
        assert_eq!(eos_token_ids(llama3).unwrap(), [128001, 128008, 128009]);
        assert!(eos_token_ids(br#"{"eos_token_id": null}"#).unwrap().is_empty());
        assert!(eos_token_ids(br#"{"bos_token_id": 1}"#).unwrap().is_empty());
    }

    #[test]
    fn a_bad_eos_token_id_is_an_error_naming_it() {
        for bad in [
            r#"{"eos_token_id": "</s>"}"#,
            r#"{"eos_token_id": [1, -2]}"#,
            r#"{"eos_token_id": 4294967296}"#,
        ] {
            let err = eos_token_ids(bad.as_bytes()).unwrap_err();
            assert!(err.contains("eos_token_id"), "{bad}: {err}");
        }
        assert!(eos_token_ids(b"{not json").is_err());
    }

    #[test]
    fn the_fixture_model_stops_at_its_generation_config_eos() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/models/llama");
        let tokenizer = HfTokenizer::from_dir(&dir).unwrap();
        let ids = stop_ids(&dir, &tokenizer).unwrap();
        // generation_config.json says eos_token_id 1; the tokenizer's own EOS (if any) comes first.
        assert!(ids.contains(&1), "{ids:?}");
        assert_eq!(ids.iter().filter(|&&i| i == 1).count(), 1, "{ids:?}");
    }
}

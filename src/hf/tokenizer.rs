//! A model's `tokenizer.json` through the `tokenizers` crate (the library the
//! Python `tokenizers`/`transformers` packages are built on, so ids match), and
//! the special tokens `tokenizer_config.json` names.

use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::io::read_regular;

/// `tokenizer.json` files above this are refused before reading (the largest published ones,
/// 256k-token vocabularies, are under 40 MB).
pub const MAX_TOKENIZER_BYTES: u64 = 256 << 20;

/// A Hugging Face tokenizer with its beginning- and end-of-sequence tokens.
pub struct HfTokenizer {
    inner: tokenizers::Tokenizer,
    bos: Option<u32>,
    eos: Vec<u32>,
}

fn tokenizer_error(path: &Path, err: impl std::fmt::Display) -> Error {
    Error::InvalidFile {
        path: path.display().to_string(),
        reason: format!("not a usable tokenizer: {err}"),
    }
}

/// A special token written as `"<s>"` or as `{"content": "<s>", ...}`.
fn token_text(value: &Value) -> Option<&str> {
    value.as_str().or_else(|| value.get("content").and_then(Value::as_str))
}

impl HfTokenizer {
    /// Loads `DIR/tokenizer.json`, and `DIR/tokenizer_config.json` if present for bos/eos.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        let bytes = read_regular(&path, MAX_TOKENIZER_BYTES, "")?;
        let inner = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|err| tokenizer_error(&path, err))?;
        let mut tokenizer = HfTokenizer {
            inner,
            bos: None,
            eos: Vec::new(),
        };
        let config_path = dir.join("tokenizer_config.json");
        if config_path.exists() {
            let text = read_regular(&config_path, MAX_TOKENIZER_BYTES, "")?;
            let config: Value = serde_json::from_slice(&text).map_err(|err| tokenizer_error(&config_path, err))?;
            tokenizer.bos = config
                .get("bos_token")
                .and_then(token_text)
                .and_then(|t| tokenizer.token_id(t));
            if let Some(eos) = config
                .get("eos_token")
                .and_then(token_text)
                .and_then(|t| tokenizer.token_id(t))
            {
                tokenizer.eos.push(eos);
            }
        }
        Ok(tokenizer)
    }

    /// Token ids of `text`; `add_special_tokens` applies the tokenizer's post-processor (e.g. a
    /// leading `<s>`). Evaluation and fine-tuning on plain text use `false`.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        self.inner
            .encode(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|err| Error::InvalidSetting {
                setting: "text",
                value: format!("{} bytes", text.len()),
                reason: format!("cannot be tokenized: {err}"),
            })
    }

    /// The text of `ids`; `skip_special_tokens` drops `<s>`-like tokens.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.check_ids(ids)?;
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|err| Error::InvalidSetting {
                setting: "token ids",
                value: format!("{} ids", ids.len()),
                reason: format!("cannot be decoded: {err}"),
            })
    }

    /// A decoder that turns ids into text as they are generated: each call returns the text that
    /// became final with this id (none while a multi-byte character is incomplete).
    pub fn stream(&self, skip_special_tokens: bool) -> TokenStream<'_> {
        TokenStream {
            tokenizer: self,
            ids: Vec::new(),
            emitted: 0,
            skip_special_tokens,
        }
    }

    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        let len = self.vocab_size();
        match ids.iter().position(|&id| id as usize >= len) {
            Some(position) => Err(Error::IndexOutOfRange {
                what: "token id",
                index: u64::from(ids[position]),
                position,
                len,
            }),
            None => Ok(()),
        }
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The id of token text `token`, if it is in the vocabulary.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The beginning-of-sequence id from `tokenizer_config.json`, if any.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// End-of-sequence ids: generation stops at any of them.
    pub fn eos(&self) -> &[u32] {
        &self.eos
    }
}

/// Incremental detokenization for streaming output.
pub struct TokenStream<'a> {
    tokenizer: &'a HfTokenizer,
    ids: Vec<u32>,
    emitted: usize,
    skip_special_tokens: bool,
}

impl TokenStream<'_> {
    /// Adds `id` and returns the newly final text. Text is final once decoding all ids so far no
    /// longer ends in U+FFFD (an incomplete UTF-8 sequence from byte-level or byte-fallback tokens).
    /// Decoding the whole prefix each time keeps word-boundary rules (leading-space stripping)
    /// exactly as a one-shot decode; generation lengths are small enough for the quadratic cost.
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        let text = self.tokenizer.decode(&self.ids, self.skip_special_tokens)?;
        if text.ends_with('\u{FFFD}') || !text.is_char_boundary(self.emitted.min(text.len())) {
            return Ok(String::new());
        }
        let new = text.get(self.emitted..).unwrap_or("").to_string();
        self.emitted = text.len();
        Ok(new)
    }
}

//! The tokenizer matches the Python `tokenizers` library id for id on the checked-in fixtures
//! (made by scripts/fixtures/make_tokenizers.py): byte-level BPE (Llama 3 / Qwen2 style) and
//! SentencePiece-style BPE with byte fallback (Llama 2 / Mistral style).

use std::path::{Path, PathBuf};

use fp8_engine::hf::HfTokenizer;
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn encode_and_decode_match_the_python_library() {
    let cases: Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("tokenizer_cases.json")).unwrap()).unwrap();
    for kind in ["bytelevel", "metaspace"] {
        let tok = HfTokenizer::from_dir(&fixtures().join(kind)).unwrap();
        assert_eq!(
            tok.vocab_size() as u64,
            cases[kind]["vocab_size"].as_u64().unwrap(),
            "{kind}"
        );
        let list = cases[kind]["cases"].as_array().unwrap();
        assert!(list.len() >= 10);
        for case in list {
            let text = case["text"].as_str().unwrap();
            let plain = tok.encode(text, false).unwrap();
            assert_eq!(plain, ids(&case["ids"]), "{kind}: encode {text:?}");
            assert_eq!(
                tok.encode(text, true).unwrap(),
                ids(&case["ids_with_special"]),
                "{kind}: special {text:?}"
            );
            let decoded = tok.decode(&plain, true).unwrap();
            assert_eq!(decoded, case["decoded"].as_str().unwrap(), "{kind}: decode {text:?}");
            // Streaming pieces concatenate to the one-shot decode, with no U+FFFD halfway.
            let mut stream = tok.stream(true);
            let mut streamed = String::new();
            for &id in &plain {
                streamed.push_str(&stream.push(id).unwrap());
            }
            assert_eq!(streamed, decoded, "{kind}: stream {text:?}");
        }
    }
}

#[test]
fn bad_inputs_are_errors_that_say_what() {
    let tok = HfTokenizer::from_dir(&fixtures().join("bytelevel")).unwrap();
    let err = tok.decode(&[1, 2, 400], false).unwrap_err().to_string();
    assert!(err.contains("token id 400") && err.contains("below 400"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let missing = HfTokenizer::from_dir(dir.path()).err().unwrap().to_string();
    assert!(missing.contains("tokenizer.json"), "{missing}");
    std::fs::write(dir.path().join("tokenizer.json"), "{\"model\": 3}").unwrap();
    let bad = HfTokenizer::from_dir(dir.path()).err().unwrap().to_string();
    assert!(bad.contains("not a usable tokenizer"), "{bad}");
    std::fs::remove_file(dir.path().join("tokenizer.json")).unwrap();
    std::fs::create_dir(dir.path().join("tokenizer.json")).unwrap();
    let not_file = HfTokenizer::from_dir(dir.path()).err().unwrap().to_string();
    assert!(not_file.contains("not a regular file"), "{not_file}");
}

#[test]
fn special_tokens_come_from_tokenizer_config() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixtures().join("metaspace/tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"bos_token": "<s>", "eos_token": {"content": "</s>", "lstrip": false}, "add_bos_token": true}"#,
    )
    .unwrap();
    let tok = HfTokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tok.bos(), tok.token_id("<s>"));
    assert_eq!(tok.eos(), &[tok.token_id("</s>").unwrap()]);
    assert!(tok.bos().is_some());
}

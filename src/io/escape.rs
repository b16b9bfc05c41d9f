//! Names from input files (tensor names, metadata keys) printed safely: a name
//! may hold newlines or terminal escape sequences, which would forge output
//! lines or drive the terminal if printed raw.

/// `text` with backslashes, control characters and other non-printing characters escaped
/// (`\n`, `\t`, `\u{1b}`...); printable text, non-ASCII letters included, is unchanged.
pub fn escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            // Control characters, bidirectional overrides and other format characters.
            c if c.is_control()
                || ('\u{200b}'..='\u{200f}').contains(&c)
                || ('\u{202a}'..='\u{202e}').contains(&c)
                || ('\u{2066}'..='\u{2069}').contains(&c) =>
            {
                out.push_str(&format!("\\u{{{:x}}}", c as u32));
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::escaped;

    #[test]
    fn control_characters_are_escaped_and_letters_kept() {
        assert_eq!(escaped("layers.0.weight"), "layers.0.weight");
        assert_eq!(escaped("a\nb\x1b[31m"), "a\\nb\\u{1b}[31m");
        assert_eq!(escaped("ÄÖ\\"), "ÄÖ\\\\");
        assert_eq!(escaped("x\u{202e}y"), "x\\u{202e}y");
    }
}

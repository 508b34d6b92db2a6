//! Every unescaping implementation (portable, SSE2, AVX2, AVX-512 VBMI2, NEON: whichever
//! this CPU runs) against a byte-at-a-time reference and against each other, on every token
//! length up to 200 with each escape at every position, and on random tokens dense with
//! escapes.

use ccfleet::lineproto::{TokenKind, unescape_implementations};

const KINDS: [TokenKind; 3] = [
    TokenKind::Measurement,
    TokenKind::Key,
    TokenKind::StringField,
];

/// The escape rules as the Go decoder applies them, one byte at a time: a backslash
/// followed by a byte of the kind's set stands for that byte (`n`, `r`, `t` for control
/// characters in strings); any other backslash is literal and the byte after it is read
/// afresh.
fn reference(raw: &str, kind: TokenKind) -> String {
    let bytes = raw.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let next = bytes.get(i + 1).copied();
        let replaced = match (kind, b, next) {
            (_, b'\\', None) => None,
            (TokenKind::Measurement, b'\\', Some(c @ (b' ' | b','))) => Some(c),
            (TokenKind::Key, b'\\', Some(c @ (b' ' | b',' | b'='))) => Some(c),
            (TokenKind::StringField, b'\\', Some(c @ (b'\\' | b'"'))) => Some(c),
            (TokenKind::StringField, b'\\', Some(b'n')) => Some(b'\n'),
            (TokenKind::StringField, b'\\', Some(b'r')) => Some(b'\r'),
            (TokenKind::StringField, b'\\', Some(b't')) => Some(b'\t'),
            _ => None,
        };
        match replaced {
            Some(c) => {
                out.push(c);
                i += 2;
            }
            None => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).expect("unescaping keeps UTF-8")
}

fn check(raw: &str) {
    for kind in KINDS {
        let want = reference(raw, kind);
        for (name, unescape) in unescape_implementations() {
            // Appends after what the buffer already holds.
            let mut out = String::from("prefix:");
            unescape(raw, kind, &mut out);
            assert_eq!(
                out.strip_prefix("prefix:"),
                Some(want.as_str()),
                "{name} {kind:?} {raw:?}"
            );
        }
    }
}

#[test]
fn the_implementations_this_cpu_runs_are_all_tested() {
    let names: Vec<_> = unescape_implementations()
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(names[0], "word");
    #[cfg(target_arch = "x86_64")]
    {
        assert!(names.contains(&"sse2"));
        assert_eq!(
            names.contains(&"avx2"),
            std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("popcnt")
        );
        assert_eq!(
            names.contains(&"avx512"),
            std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("avx512f")
                && std::is_x86_feature_detected!("avx512bw")
                && std::is_x86_feature_detected!("avx512vl")
                && std::is_x86_feature_detected!("avx512vbmi2")
                && std::is_x86_feature_detected!("popcnt")
        );
    }
    #[cfg(target_arch = "aarch64")]
    assert!(names.contains(&"neon"));
}

#[test]
fn every_escape_at_every_position_of_every_length_up_to_200_unescapes_alike() {
    // Each escape (or a lone backslash, a literal one, a run of them, a multi-byte
    // character) at every position of a token of every length: every split between whole
    // blocks, the block carried over and the tail, for every block width.
    let escapes = [
        "\\", "\\\\", "\\\\\\", "\\\"", "\\n", "\\r", "\\t", "\\ ", "\\,", "\\=", "\\x", "\\\\\"",
        "é", "\\é",
    ];
    for n in 0..=200 {
        for at in 0..=n {
            for escape in escapes {
                let raw = format!("{}{escape}{}", "a".repeat(at), "b".repeat(n - at));
                check(&raw);
            }
        }
    }
}

#[test]
fn random_tokens_dense_with_escapes_unescape_alike() {
    let alphabet = [
        "a",
        "\\",
        "\\",
        "\"",
        " ",
        ",",
        "=",
        "n",
        "r",
        "t",
        "é",
        "😀",
        "xxxxxxxxxxxxxxx",
    ];
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..20_000 {
        let mut raw = String::new();
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        for _ in 0..seed % 150 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            raw.push_str(alphabet[(seed % alphabet.len() as u64) as usize]);
        }
        check(&raw);
    }
}

#[test]
fn a_roster_payload_unescapes_alike() {
    let json = r#"{"serviceType":"metric-store","hostname":"node0001.cluster.example.org","meta":{"port":"8080"}}"#;
    let raw = json.replace('\\', "\\\\").replace('"', "\\\"").repeat(40);
    check(&raw);
    assert!(reference(&raw, TokenKind::StringField).starts_with(json));
}

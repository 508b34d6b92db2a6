//! Instance ids: what the server hands a registered member, 32 lowercase hex digits on the
//! wire (REST paths and bodies, heartbeats) and a 128-bit number in the registry. Every
//! check and conversion of one is here, so the wire and the registry agree on the shape.

/// Whether `s` has the shape of an instance id: exactly 32 lowercase hex digits.
pub fn is_instance_id(s: &str) -> bool {
    parse_instance_id(s).is_some()
}

/// Parses an instance id (exactly 32 lowercase hex digits) into its 128-bit value.
pub fn parse_instance_id(s: &str) -> Option<u128> {
    let bytes = s.as_bytes();
    if bytes.len() != 32 {
        return None;
    }
    let mut value: u128 = 0;
    for &b in bytes {
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => return None,
        };
        value = (value << 4) | u128::from(digit);
    }
    Some(value)
}

/// Formats a 128-bit instance id as 32 lowercase hex digits.
pub fn format_instance_id(id: u128) -> String {
    format!("{id:032x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_32_lowercase_hex_digits_and_round_trip() {
        let id = "3f1c9a2b7d4e6f8a0b1c2d3e4f5a6b7c";
        assert!(is_instance_id(id));
        assert_eq!(format_instance_id(parse_instance_id(id).unwrap()), id);
        assert_eq!(format_instance_id(1), "00000000000000000000000000000001");
        assert_eq!(format_instance_id(u128::MAX), "f".repeat(32));
        for bad in [
            "3F1C9A2B7D4E6F8A0B1C2D3E4F5A6B7C",
            "+f1c9a2b7d4e6f8a0b1c2d3e4f5a6b7c",
            "3f1c9a2b7d4e6f8a0b1c2d3e4f5a6b7",
            "3f1c9a2b7d4e6f8a0b1c2d3e4f5a6b7g",
            "3f1c9a2b7d4e6f8a0b1c2d3e4f5a6b7c0",
            "abc",
            "",
        ] {
            assert!(!is_instance_id(bad), "{bad}");
            assert_eq!(parse_instance_id(bad), None, "{bad}");
        }
    }
}

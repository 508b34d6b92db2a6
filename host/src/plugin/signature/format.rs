//! The bytes of wasmsign2's embedded signatures (the WebAssembly signatures proposal of the
//! `wasm-signatures` group, as the `wasmsign2` tool writes them), read and written without
//! trusting a single length: every length is checked against the bytes that are actually
//! there before anything is taken, so no input allocates more than it holds or panics.
//!
//! A signed binary is the WebAssembly header (module or component), a first custom section
//! named `signature`, then the sections that were signed, unchanged. The section's payload:
//!
//! ```text
//! spec-version (0x01) content-type (0x01) hash-function (0x01 = SHA-256)
//! varuint32 count of signed hash sets, each a varuint32-length-prefixed:
//!     varuint32 count of hashes, each 32 bytes
//!     varuint32 count of signatures, each a varuint32-length-prefixed:
//!         varuint32-length-prefixed key id (may be empty)
//!         algorithm (0x01 = Ed25519)
//!         varuint32-length-prefixed signature
//! ```
//!
//! A signature signs `"wasmsig" ‖ 0x01 ‖ 0x01 ‖ 0x01 ‖ hashes`; a whole-binary hash is the
//! SHA-256 of every byte after the signature section (the header is not covered: the agent
//! runs only components, whose header it checks itself).

/// The WebAssembly module header (magic and version 1).
pub const MODULE_HEADER: [u8; 8] = [0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00];
/// The WebAssembly component header (magic, version 0x0d, layer 1).
pub const COMPONENT_HEADER: [u8; 8] = [0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];
/// The custom section holding the signatures.
pub const SECTION_NAME: &str = "signature";
/// The specification version, content type (a WebAssembly binary) and hash function
/// (SHA-256) the format has.
pub const VERSION: u8 = 0x01;
/// See [`VERSION`].
pub const CONTENT_TYPE: u8 = 0x01;
/// See [`VERSION`].
pub const HASH_SHA256: u8 = 0x01;
/// The algorithm identifier of an Ed25519 signature.
pub const ED25519: u8 = 0x01;
/// The prefix of every signed message.
pub const DOMAIN: &[u8] = b"wasmsig";
/// The most hash sets and hashes per set read (wasmsign2's own bound).
pub const MAX_HASHES: usize = 64;
/// The most signatures per set read (wasmsign2's own bound).
pub const MAX_SIGNATURES: usize = 256;

/// Why bytes are not a well-formed signed binary.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// Not a WebAssembly module or component.
    #[error("it is not a WebAssembly module or component")]
    NotWasm,
    /// The signature data is cut short or inconsistent.
    #[error("{0}")]
    Malformed(&'static str),
    /// A version, content type or hash function this reader does not know.
    #[error("unsupported {what} 0x{value:02x}")]
    Unsupported {
        /// The field.
        what: &'static str,
        /// Its value.
        value: u8,
    },
}

/// One signature of a hash set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature<'a> {
    /// The signer's key id (empty: none given).
    pub key_id: &'a [u8],
    /// The algorithm ([`ED25519`]).
    pub algorithm: u8,
    /// The signature bytes.
    pub bytes: &'a [u8],
}

/// Hashes and the signatures over them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SignedHashes<'a> {
    /// The SHA-256 hashes signed together.
    pub hashes: Vec<&'a [u8; 32]>,
    /// Signatures of `DOMAIN ‖ version ‖ content type ‖ hash function ‖ hashes`.
    pub signatures: Vec<Signature<'a>>,
}

impl SignedHashes<'_> {
    /// The message each of [`SignedHashes::signatures`] signs.
    pub fn message(&self) -> Vec<u8> {
        message(self.hashes.iter().map(|h| h.as_slice()))
    }
}

/// The message a signature over `hashes` signs.
pub fn message<'h>(hashes: impl Iterator<Item = &'h [u8]>) -> Vec<u8> {
    let mut msg = Vec::with_capacity(DOMAIN.len() + 3 + 32);
    msg.extend_from_slice(DOMAIN);
    msg.extend_from_slice(&[VERSION, CONTENT_TYPE, HASH_SHA256]);
    for hash in hashes {
        msg.extend_from_slice(hash);
    }
    msg
}

/// A binary split at its signature section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split<'a> {
    /// The header (module or component).
    pub header: &'a [u8; 8],
    /// The signature section's payload (after its name), if the first section is one.
    pub signature: Option<&'a [u8]>,
    /// Everything after the signature section (all sections when there is none): what a
    /// whole-binary signature covers.
    pub signed: &'a [u8],
}

/// A cursor over bytes that takes nothing it does not have.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn byte(&mut self, what: &'static str) -> Result<u8, FormatError> {
        let (&first, rest) = self
            .bytes
            .split_first()
            .ok_or(FormatError::Malformed(what))?;
        self.bytes = rest;
        Ok(first)
    }

    /// A LEB128 unsigned 32-bit integer, at most 5 bytes, no bits beyond 32.
    fn u32(&mut self, what: &'static str) -> Result<u32, FormatError> {
        let mut value: u32 = 0;
        for i in 0..5 {
            let byte = self.byte(what)?;
            let bits = u32::from(byte & 0x7f);
            if i == 4 && bits > 0x0f {
                return Err(FormatError::Malformed(what));
            }
            value |= bits << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(FormatError::Malformed(what))
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], FormatError> {
        if n > self.bytes.len() {
            return Err(FormatError::Malformed(what));
        }
        let (taken, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(taken)
    }

    fn slice(&mut self, what: &'static str) -> Result<&'a [u8], FormatError> {
        let n = self.u32(what)?;
        self.take(usize::try_from(n).unwrap_or(usize::MAX), what)
    }

    fn count(&mut self, max: usize, what: &'static str) -> Result<usize, FormatError> {
        let n = usize::try_from(self.u32(what)?).unwrap_or(usize::MAX);
        if n > max {
            return Err(FormatError::Malformed(what));
        }
        Ok(n)
    }
}

/// Splits a module or component at its signature section (the first section, if it is a
/// custom section named `signature`).
pub fn split(binary: &[u8]) -> Result<Split<'_>, FormatError> {
    let Some((header, body)) = binary.split_first_chunk::<8>() else {
        return Err(FormatError::NotWasm);
    };
    if *header != MODULE_HEADER && *header != COMPONENT_HEADER {
        return Err(FormatError::NotWasm);
    }
    let unsigned = Split {
        header,
        signature: None,
        signed: body,
    };
    let mut reader = Reader { bytes: body };
    let Ok(0) = reader.byte("") else {
        return Ok(unsigned);
    };
    let payload = reader.slice("the first section is cut short")?;
    let after = reader.bytes;
    let mut section = Reader { bytes: payload };
    let name = section.slice("the first custom section's name is cut short")?;
    if name != SECTION_NAME.as_bytes() {
        return Ok(unsigned);
    }
    Ok(Split {
        header,
        signature: Some(section.bytes),
        signed: after,
    })
}

/// Reads a signature section's payload.
pub fn parse(payload: &[u8]) -> Result<Vec<SignedHashes<'_>>, FormatError> {
    let mut r = Reader { bytes: payload };
    for (what, expected) in [
        ("specification version", VERSION),
        ("content type", CONTENT_TYPE),
        ("hash function", HASH_SHA256),
    ] {
        let value = r.byte("the signature header is cut short")?;
        if value != expected {
            return Err(FormatError::Unsupported { what, value });
        }
    }
    let sets = r.count(MAX_HASHES, "too many signed hash sets")?;
    let mut out = Vec::with_capacity(sets);
    for _ in 0..sets {
        let set = r.slice("a signed hash set is cut short")?;
        out.push(parse_set(set)?);
    }
    if !r.bytes.is_empty() {
        return Err(FormatError::Malformed(
            "bytes follow the last signed hash set",
        ));
    }
    Ok(out)
}

fn parse_set(bytes: &[u8]) -> Result<SignedHashes<'_>, FormatError> {
    let mut r = Reader { bytes };
    let count = r.count(MAX_HASHES, "too many hashes in a set")?;
    let mut hashes = Vec::with_capacity(count);
    for _ in 0..count {
        let hash = r.take(32, "a hash is cut short")?;
        hashes.push(
            hash.try_into()
                .map_err(|_| FormatError::Malformed("a hash is cut short"))?,
        );
    }
    let count = r.count(MAX_SIGNATURES, "too many signatures in a set")?;
    let mut signatures = Vec::with_capacity(count);
    for _ in 0..count {
        let mut s = Reader {
            bytes: r.slice("a signature is cut short")?,
        };
        let key_id = s.slice("a signature's key id is cut short")?;
        let algorithm = s.byte("a signature's algorithm is missing")?;
        let bytes = s.slice("a signature's bytes are cut short")?;
        signatures.push(Signature {
            key_id,
            algorithm,
            bytes,
        });
    }
    Ok(SignedHashes { hashes, signatures })
}

/// Appends `value` as LEB128.
fn put_u32(out: &mut Vec<u8>, mut value: u32) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// Appends `bytes` with their length.
fn put_slice(out: &mut Vec<u8>, bytes: &[u8]) -> Result<(), FormatError> {
    let len = u32::try_from(bytes.len())
        .map_err(|_| FormatError::Malformed("a part longer than 4 GiB"))?;
    put_u32(out, len);
    out.extend_from_slice(bytes);
    Ok(())
}

/// A signature section's payload holding `sets`.
pub fn encode(sets: &[SignedHashes<'_>]) -> Result<Vec<u8>, FormatError> {
    let mut out = vec![VERSION, CONTENT_TYPE, HASH_SHA256];
    put_u32(&mut out, sets.len().try_into().unwrap_or(u32::MAX));
    for set in sets {
        let mut inner = Vec::new();
        put_u32(&mut inner, set.hashes.len().try_into().unwrap_or(u32::MAX));
        for hash in &set.hashes {
            inner.extend_from_slice(hash.as_slice());
        }
        put_u32(
            &mut inner,
            set.signatures.len().try_into().unwrap_or(u32::MAX),
        );
        for signature in &set.signatures {
            let mut one = Vec::new();
            put_slice(&mut one, signature.key_id)?;
            one.push(signature.algorithm);
            put_slice(&mut one, signature.bytes)?;
            put_slice(&mut inner, &one)?;
        }
        put_slice(&mut out, &inner)?;
    }
    Ok(out)
}

/// `header`, a signature section holding `payload`, then `signed`.
pub fn assemble(header: &[u8; 8], payload: &[u8], signed: &[u8]) -> Result<Vec<u8>, FormatError> {
    let mut section = Vec::with_capacity(payload.len() + 16);
    put_slice(&mut section, SECTION_NAME.as_bytes())?;
    section.extend_from_slice(payload);
    let mut out = Vec::with_capacity(section.len() + signed.len() + 16);
    out.extend_from_slice(header);
    out.push(0);
    put_slice(&mut out, &section)?;
    out.extend_from_slice(signed);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leb128_round_trips_and_overlong_forms_are_refused() {
        for value in [0u32, 1, 127, 128, 300, 16_383, 16_384, u32::MAX] {
            let mut out = Vec::new();
            put_u32(&mut out, value);
            let mut r = Reader { bytes: &out };
            assert_eq!(r.u32("x").unwrap(), value);
            assert!(r.bytes.is_empty());
        }
        // A fifth byte with bits beyond 32, and a sixth byte.
        for bad in [
            &[0xff, 0xff, 0xff, 0xff, 0x1f][..],
            &[0x80, 0x80, 0x80, 0x80, 0x80, 0x00],
            &[0x80],
        ] {
            assert!(Reader { bytes: bad }.u32("x").is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_payload_round_trips() {
        let hash = [7u8; 32];
        let sets = vec![SignedHashes {
            hashes: vec![&hash],
            signatures: vec![
                Signature {
                    key_id: b"",
                    algorithm: ED25519,
                    bytes: &[1; 64],
                },
                Signature {
                    key_id: b"site",
                    algorithm: ED25519,
                    bytes: &[2; 64],
                },
            ],
        }];
        let payload = encode(&sets).unwrap();
        assert_eq!(parse(&payload).unwrap(), sets);
        let binary = assemble(&COMPONENT_HEADER, &payload, b"\x01\x00").unwrap();
        let split = split(&binary).unwrap();
        assert_eq!(split.header, &COMPONENT_HEADER);
        assert_eq!(split.signature, Some(&payload[..]));
        assert_eq!(split.signed, b"\x01\x00");
    }

    #[test]
    fn lengths_beyond_the_bytes_are_errors() {
        // A set claiming 4 GiB in a ten-byte payload.
        let payload = [
            VERSION,
            CONTENT_TYPE,
            HASH_SHA256,
            1,
            0xff,
            0xff,
            0xff,
            0xff,
            0x0f,
        ];
        assert!(matches!(parse(&payload), Err(FormatError::Malformed(_))));
        let mut binary = COMPONENT_HEADER.to_vec();
        binary.extend_from_slice(&[0, 0xff, 0xff, 0xff, 0xff, 0x0f]);
        assert!(split(&binary).is_err());
        assert_eq!(split(b"\0asm"), Err(FormatError::NotWasm));
        assert_eq!(split(b"\x7fELF\x02\x01\x01\0\0"), Err(FormatError::NotWasm));
    }
}

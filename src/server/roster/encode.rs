//! Roster encoding: a roster's members as the JSON payload its consumers accept, with the
//! largest members left out when it would exceed their limit.

use std::collections::BTreeMap;

use crate::server::registry::Service;
use crate::wire::ServiceType;

/// The most bytes a roster may have: what agents accept unless configured otherwise
/// (`roster-max-bytes`, also cc-lib's limit). A roster that would be larger leaves out its
/// largest members, so that the rest of the cluster keeps its rosters.
pub const ROSTER_LIMIT: usize = 1 << 20;

/// A roster entry as it is encoded: borrowed from the registry's row, so a round builds no
/// owned copy of any member.
#[derive(serde::Serialize)]
struct ProviderView<'a> {
    #[serde(rename = "type")]
    service_type: &'static str,
    hostname: &'a str,
    state: &'static str,
    #[serde(skip_serializing_if = "no_meta")]
    meta: &'a BTreeMap<String, String>,
}

fn no_meta(meta: &&BTreeMap<String, String>) -> bool {
    meta.is_empty()
}

/// A member left out of a roster because the roster would otherwise exceed what its
/// consumers accept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct LeftOut {
    pub(super) cluster: String,
    pub(super) hostname: String,
    pub(super) service_type: ServiceType,
    /// Bytes of its metadata's keys and values.
    pub(super) meta_bytes: usize,
}

/// The providers of one roster, encoded once for every subject that gets the same list.
#[derive(Debug)]
pub(super) struct Encoded {
    /// The providers as Go's JSON.
    pub(super) payload: Vec<u8>,
    /// A hash of `payload`, to tell whether a roster changed.
    pub(super) hash: u64,
    /// How many providers it lists.
    pub(super) providers: usize,
    /// Members left out for size.
    pub(super) left_out: Vec<LeftOut>,
}

/// Bytes a roster line adds around its payload besides the bucket (measurement, tags, field
/// key, quotes, time, newline), with room to spare.
pub(super) const LINE_OVERHEAD: usize = 96;
/// Room kept below NATS's `max_payload` for the signature header.
pub(super) const HEADER_ROOM: usize = 256;

pub(super) fn hash_of(bytes: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    bytes.hash(&mut hasher);
    hasher.finish()
}

/// What a member adds to a roster, about: its own bytes, before JSON's and the line's escapes.
fn member_size(service: &Service) -> usize {
    32 + service.hostname.len() + meta_bytes(service) + 6 * service.meta.len()
}

/// Bytes of a member's metadata keys and values.
fn meta_bytes(service: &Service) -> usize {
    service.meta.iter().map(|(k, v)| k.len() + v.len()).sum()
}

/// The bytes `payload` takes inside a roster line, where `"` and `\` are escaped.
pub(super) fn escaped_len(payload: &[u8]) -> usize {
    payload.len() + payload.iter().filter(|&&b| b == b'"' || b == b'\\').count()
}

/// Encodes `members` (sorted as rosters are) into a payload whose line, for a bucket named
/// `bucket`, stays within `limit` bytes. When it would not, the members with the most bytes
/// (their metadata, in practice) are left out until it fits: the roster is then an error of
/// those members, and every other member still reaches the roster's consumers.
pub(super) fn encode_members(
    mut members: Vec<&Service>,
    bucket: &str,
    limit: usize,
) -> Result<Encoded, String> {
    let room = limit.saturating_sub(LINE_OVERHEAD + 2 * bucket.len());
    let mut left_out = Vec::new();
    loop {
        let views: Vec<ProviderView<'_>> = members
            .iter()
            .map(|s| ProviderView {
                service_type: s.service_type.code(),
                hostname: &s.hostname,
                state: s.state.as_str(),
                meta: &s.meta,
            })
            .collect();
        let payload = crate::wire::gojson::to_vec(&views).map_err(|e| e.to_string())?;
        let size = escaped_len(&payload);
        if size <= room || members.is_empty() {
            return Ok(Encoded {
                hash: hash_of(&payload),
                payload,
                providers: members.len(),
                left_out,
            });
        }
        let excess = size - room;
        let mut by_size: Vec<usize> = (0..members.len()).collect();
        by_size.sort_by_key(|&i| std::cmp::Reverse(member_size(members[i])));
        let mut dropped = vec![false; members.len()];
        let mut freed = 0;
        for i in by_size {
            if freed >= excess {
                break;
            }
            dropped[i] = true;
            freed += member_size(members[i]);
            left_out.push(LeftOut {
                cluster: members[i].cluster.clone(),
                hostname: members[i].hostname.clone(),
                service_type: members[i].service_type,
                meta_bytes: meta_bytes(members[i]),
            });
        }
        let mut i = 0;
        members.retain(|_| {
            i += 1;
            !dropped[i - 1]
        });
    }
}

//! gmond's XDR messages (`lib/gm_protocol.x`): the metadata message (`gmetadata_full`) and
//! the value message (`gmetric_string`), as libganglia's `Ganglia_metric_send` sends them.

/// `gmetadata_full` in `Ganglia_msg_formats`.
const GMETADATA_FULL: u32 = 128;
/// `gmetric_string` in `Ganglia_msg_formats`.
const GMETRIC_STRING: u32 = 133;

/// The longest message gmond reads (`GANGLIA_MAX_XDR_MESSAGE_LEN`: an Ethernet MTU less
/// the UDP and IP headers and 8 bytes).
pub const MAX_MESSAGE_LEN: usize = 1500 - 28 - 8;

/// One metric as the two messages carry it.
#[derive(Debug, Clone, PartialEq)]
pub struct Metric<'a> {
    /// The sending host's name (not spoofed: gmond names the host by the sender's address).
    pub host: &'a str,
    /// The metric's name.
    pub name: &'a str,
    /// Its Ganglia type (`double`, `float`, `int32`, `uint32`, `string`).
    pub kind: &'a str,
    /// Its units.
    pub units: &'a str,
    /// `GANGLIA_SLOPE_*`: 0 zero, 3 both.
    pub slope: u32,
    /// Seconds between values at most.
    pub tmax: u32,
    /// Seconds after which gmond deletes the metric (0: never).
    pub dmax: u32,
    /// Extra data (`GROUP`, `CLUSTER`).
    pub extra: &'a [(&'a str, &'a str)],
    /// The value as text.
    pub value: &'a str,
}

fn put_u32(out: &mut Vec<u8>, n: u32) {
    out.extend_from_slice(&n.to_be_bytes());
}

/// An XDR `string<>`: its length, its bytes, zero padding to a multiple of four.
fn put_string(out: &mut Vec<u8>, s: &str) {
    put_u32(out, s.len() as u32);
    out.extend_from_slice(s.as_bytes());
    out.resize(out.len() + (4 - s.len() % 4) % 4, 0);
}

/// `Ganglia_metric_id` with `spoof` false.
fn put_id(out: &mut Vec<u8>, metric: &Metric<'_>) {
    put_string(out, metric.host);
    put_string(out, metric.name);
    put_u32(out, 0);
}

/// The metadata message into `out` (cleared first).
pub fn metadata(metric: &Metric<'_>, out: &mut Vec<u8>) {
    out.clear();
    put_u32(out, GMETADATA_FULL);
    put_id(out, metric);
    put_string(out, metric.kind);
    put_string(out, metric.name);
    put_string(out, metric.units);
    put_u32(out, metric.slope);
    put_u32(out, metric.tmax);
    put_u32(out, metric.dmax);
    put_u32(out, metric.extra.len() as u32);
    for (key, value) in metric.extra {
        put_string(out, key);
        put_string(out, value);
    }
}

/// The value message into `out` (cleared first).
pub fn value(metric: &Metric<'_>, out: &mut Vec<u8>) {
    out.clear();
    put_u32(out, GMETRIC_STRING);
    put_id(out, metric);
    put_string(out, "%s");
    put_string(out, metric.value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_length_prefixed_and_padded_to_four_bytes() {
        let metric = Metric {
            host: "n1",
            name: "load_one",
            kind: "float",
            units: "",
            slope: 3,
            tmax: 70,
            dmax: 0,
            extra: &[("GROUP", "load")],
            value: "0.50",
        };
        let mut out = Vec::new();
        value(&metric, &mut out);
        let want: Vec<u8> = [
            &[0, 0, 0, 133][..],
            &[0, 0, 0, 2, b'n', b'1', 0, 0],
            &[0, 0, 0, 8],
            b"load_one",
            &[0, 0, 0, 0],
            &[0, 0, 0, 2, b'%', b's', 0, 0],
            &[0, 0, 0, 4],
            b"0.50",
        ]
        .concat();
        assert_eq!(out, want);
        metadata(&metric, &mut out);
        assert_eq!(&out[..4], &[0, 0, 0, 128]);
        assert_eq!(out.len() % 4, 0);
        assert_eq!(
            &out[out.len() - 20..],
            b"\0\0\0\x05GROUP\0\0\0\0\0\0\x04load"
        );
    }
}

//! How cc-lib's Ganglia sinks name and describe a point: Ganglia's own names for the
//! metrics gmond also collects (with their group, type, slope, `tmax` and units), and for
//! the others the type of the value, the `group` and `unit` tags, slope `both` and `tmax`
//! 300.

use ccfleet::lineproto::{FieldValue, Line};

/// `GANGLIA_SLOPE_ZERO`.
pub const SLOPE_ZERO: u32 = 0;
/// `GANGLIA_SLOPE_BOTH`.
pub const SLOPE_BOTH: u32 = 3;
/// `tmax` of a metric Ganglia does not know.
const DEFAULT_TMAX: u32 = 300;

/// Ganglia's standard metrics: name, group, type, slope, tmax, units.
const STANDARD: &[(&str, &str, &str, u32, u32, &str)] = &[
    ("mem_total", "memory", "float", SLOPE_ZERO, 1200, "KB"),
    ("swap_total", "memory", "float", SLOPE_ZERO, 1200, "KB"),
    ("mem_free", "memory", "float", SLOPE_BOTH, 180, "KB"),
    ("mem_shared", "memory", "float", SLOPE_BOTH, 180, "KB"),
    ("mem_buffers", "memory", "float", SLOPE_BOTH, 180, "KB"),
    ("mem_cached", "memory", "float", SLOPE_BOTH, 180, "KB"),
    ("swap_free", "memory", "float", SLOPE_BOTH, 180, "KB"),
    ("mem_sreclaimable", "memory", "float", SLOPE_BOTH, 180, "KB"),
    ("mem_slab", "memory", "float", SLOPE_BOTH, 180, "KB"),
    ("cpu_num", "cpu", "uint32", SLOPE_ZERO, 1200, "CPUs"),
    ("cpu_speed", "cpu", "uint32", SLOPE_ZERO, 1200, "MHz"),
    ("cpu_user", "cpu", "float", SLOPE_BOTH, 90, "%"),
    ("cpu_nice", "cpu", "float", SLOPE_BOTH, 90, "%"),
    ("cpu_system", "cpu", "float", SLOPE_BOTH, 90, "%"),
    ("cpu_idle", "cpu", "float", SLOPE_BOTH, 3800, "%"),
    ("cpu_aidle", "cpu", "float", SLOPE_BOTH, 90, "%"),
    ("cpu_wio", "cpu", "float", SLOPE_BOTH, 90, "%"),
    ("cpu_intr", "cpu", "float", SLOPE_BOTH, 90, "%"),
    ("cpu_sintr", "cpu", "float", SLOPE_BOTH, 90, "%"),
    ("cpu_steal", "cpu", "float", SLOPE_BOTH, 90, "%"),
    ("cpu_guest", "cpu", "float", SLOPE_BOTH, 90, "%"),
    ("cpu_gnice", "cpu", "float", SLOPE_BOTH, 90, "%"),
    ("load_one", "load", "float", SLOPE_BOTH, 70, ""),
    ("load_five", "load", "float", SLOPE_BOTH, 325, ""),
    ("load_fifteen", "load", "float", SLOPE_BOTH, 950, ""),
    ("disk_total", "disk", "double", SLOPE_BOTH, 1200, "GB"),
    ("disk_free", "disk", "double", SLOPE_BOTH, 180, "GB"),
    ("part_max_used", "disk", "float", SLOPE_BOTH, 180, "%"),
    (
        "bytes_out",
        "network",
        "float",
        SLOPE_BOTH,
        300,
        "bytes/sec",
    ),
    ("bytes_in", "network", "float", SLOPE_BOTH, 300, "bytes/sec"),
    (
        "pkts_in",
        "network",
        "float",
        SLOPE_BOTH,
        300,
        "packets/sec",
    ),
    (
        "pkts_out",
        "network",
        "float",
        SLOPE_BOTH,
        300,
        "packets/sec",
    ),
    ("proc_run", "process", "uint32", SLOPE_BOTH, 950, ""),
    ("proc_total", "process", "uint32", SLOPE_BOTH, 950, ""),
    ("boottime", "system", "uint32", SLOPE_ZERO, 1200, "s"),
    ("sys_clock", "system", "uint32", SLOPE_ZERO, 1200, "s"),
    ("machine_type", "system", "string", SLOPE_ZERO, 1200, ""),
    ("os_name", "system", "string", SLOPE_ZERO, 1200, ""),
    ("os_release", "system", "string", SLOPE_ZERO, 1200, ""),
    ("mtu", "system", "uint32", SLOPE_BOTH, 1200, ""),
];

/// The Ganglia name of a cc-metric-collector name where they differ.
fn ganglia_name(name: &str) -> &str {
    match name {
        "net_bytes_in" => "bytes_in",
        "net_bytes_out" => "bytes_out",
        "net_pkts_in" => "pkts_in",
        "net_pkts_out" => "pkts_out",
        "cpu_iowait" => "cpu_wio",
        other => other,
    }
}

/// cc-lib's `add_type_to_name`: the type and its id put into or before the name
/// (`cpu_user` of hardware thread 3: `cpu3_user`; `flops_any` of socket 1:
/// `socket1_flops_any`), or a device appended (`nv_util_0000:3b:00.0`).
fn typed_name(name: &str, line: &Line<'_>) -> String {
    let kind = line.tag("type").map(|t| t.unescape());
    let id = line.tag("type-id").map(|t| t.unescape());
    match (kind.as_deref(), id.as_deref()) {
        (Some(kind), Some(id)) if !kind.is_empty() && name.contains(kind) => {
            name.replace(kind, &format!("{kind}{id}"))
        }
        (Some(kind), Some(id)) => format!("{kind}{id}_{name}"),
        _ => match line.tag("device") {
            Some(device) => format!("{name}_{}", device.unescape()),
            None => name.to_owned(),
        },
    }
}

/// What the two messages carry of one point.
#[derive(Debug, Clone, PartialEq)]
pub struct Described {
    /// The metric's Ganglia name.
    pub name: String,
    /// Its group (empty: none).
    pub group: String,
    /// Its Ganglia type.
    pub kind: &'static str,
    /// Its slope.
    pub slope: u32,
    /// Its `tmax`.
    pub tmax: u32,
    /// Its units (empty: none).
    pub units: String,
    /// Its value as text.
    pub value: String,
}

/// A point's Ganglia description; `None` without a `value` field that Ganglia can carry (a
/// boolean).
pub fn describe(line: &Line<'_>, add_type_to_name: bool) -> Option<Described> {
    let measurement = line.measurement().unescape();
    let value = line.field("value")?;
    let (text, kind) = match value {
        // cc-lib formats floats with six decimals.
        FieldValue::Float(v) => (format!("{v:.6}"), "double"),
        FieldValue::Int(v) => (v.to_string(), "int32"),
        FieldValue::Uint(v) => (v.to_string(), "uint32"),
        FieldValue::String(s) => (s.unescape().into_owned(), "string"),
        FieldValue::Bool(_) => return None,
    };
    let renamed = ganglia_name(&measurement);
    let mut described = match STANDARD.iter().find(|m| m.0 == renamed) {
        Some(&(name, group, kind, slope, tmax, units)) => Described {
            name: name.to_owned(),
            group: group.to_owned(),
            kind,
            slope,
            tmax,
            units: units.to_owned(),
            value: text,
        },
        None => Described {
            name: renamed.to_owned(),
            group: line
                .tag("group")
                .map(|g| g.unescape().into_owned())
                .unwrap_or_default(),
            kind,
            slope: SLOPE_BOTH,
            tmax: DEFAULT_TMAX,
            units: line
                .tag("unit")
                .map(|u| u.unescape().into_owned())
                .unwrap_or_default(),
            value: text,
        },
    };
    if add_type_to_name {
        described.name = typed_name(&measurement, line);
    }
    Some(described)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ccfleet::lineproto::Decoder;

    fn one(line: &str, typed: bool) -> Option<Described> {
        let line = Decoder::new(line.as_bytes()).next().unwrap().unwrap();
        describe(&line, typed)
    }

    #[test]
    fn standard_metrics_take_gangliass_description_others_their_tags() {
        let d = one("net_bytes_in,type=node,unit=bytes/s value=1.5 1", false).unwrap();
        assert_eq!(
            (
                d.name.as_str(),
                d.group.as_str(),
                d.kind,
                d.tmax,
                d.units.as_str()
            ),
            ("bytes_in", "network", "float", 300, "bytes/sec")
        );
        assert_eq!(d.value, "1.500000");
        let d = one(
            "flops_any,type=socket,type-id=1,unit=MFLOP/s,group=FLOPS value=2i 1",
            false,
        )
        .unwrap();
        assert_eq!(
            (
                d.name.as_str(),
                d.group.as_str(),
                d.kind,
                d.slope,
                d.units.as_str()
            ),
            ("flops_any", "FLOPS", "int32", SLOPE_BOTH, "MFLOP/s")
        );
        assert_eq!(
            one("flops_any,type=socket,type-id=1 value=2u 1", true)
                .unwrap()
                .name,
            "socket1_flops_any"
        );
        assert_eq!(
            one("cpu_user,type=cpu,type-id=3 value=2 1", true)
                .unwrap()
                .name,
            "cpu3_user"
        );
        assert_eq!(
            one("nv_util,type=accelerator,device=0000:3b value=2 1", true)
                .unwrap()
                .name,
            "nv_util_0000:3b"
        );
        assert_eq!(one("up,type=node value=true 1", false), None);
        assert_eq!(one("up,type=node other=1 1", false), None);
    }
}

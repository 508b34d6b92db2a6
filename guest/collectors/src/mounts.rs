//! The mount table (`/proc/self/mounts`, as `mount(8)` and cc-metric-collector read it).
//!
//! Plugins may not read per-process files of `/proc`; the agent serves exactly this file
//! (and `mountinfo` and `mountstats` beside it) to a plugin granted `capabilities.mount-info`,
//! so the collector asks for the path cc-metric-collector uses.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

/// The file read.
pub const PATH: &str = "/proc/self/mounts";

/// One mounted file system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// What is mounted, e.g. `/dev/vda1` or `tmpfs`.
    pub device: String,
    /// Where, with the kernel's octal escapes (`\040` for a space) undone.
    pub mount_point: String,
    /// The file system type, e.g. `ext4`.
    pub fs_type: String,
}

/// Undoes the kernel's octal escapes of the mount table (`\040` space, `\011` tab, `\012`
/// newline, `\134` backslash); anything else is kept as written.
pub fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let value = (u32::from(bytes[i + 1] - b'0') << 6)
                | (u32::from(bytes[i + 2] - b'0') << 3)
                | u32::from(bytes[i + 3] - b'0');
            if let Ok(byte) = u8::try_from(value) {
                out.push(byte);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// Parses the mount table. A line with fewer than the six fields the kernel writes is an
/// error (a file cut short), naming the line.
pub fn parse(text: &str) -> Result<Vec<Mount>, String> {
    let mut mounts = Vec::new();
    for (number, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split_ascii_whitespace().collect();
        if fields.len() < 6 {
            return Err(format!(
                "{PATH}: line {} has {} fields, expected 6",
                number + 1,
                fields.len()
            ));
        }
        mounts.push(Mount {
            device: unescape(fields[0]),
            mount_point: unescape(fields[1]),
            fs_type: unescape(fields[2]),
        });
    }
    Ok(mounts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_are_undone_and_short_lines_refused() {
        let text = "/dev/vda1 / ext4 rw 0 0\n/dev/vdb /mnt/my\\040disk xfs rw 0 0\n";
        let mounts = parse(text).unwrap();
        assert_eq!(mounts[1].mount_point, "/mnt/my disk");
        assert_eq!(mounts[0].device, "/dev/vda1");
        assert_eq!(unescape("a\\134b\\9"), "a\\b\\9");
        assert!(parse("/dev/vda1 / ext4\n").unwrap_err().contains("line 1"));
    }
}

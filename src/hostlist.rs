//! Host lists in the notation Slurm and ClusterCockpit use: `f[0101-0188,0201],login1`.
//!
//! An expression is a comma-separated list of items (commas inside brackets belong to the
//! brackets). An item is literal text with any number of bracket groups; a group holds
//! numbers and ranges (`0101-0188`) separated by commas. A number written with a leading
//! zero fixes the width every number of its range is padded to (`[08-10]` is `08 09 10`);
//! one without stands for itself (`[8-10]` is `8 9 10`).
//!
//! [`HostList::parse`] reads an expression; [`HostList::matches`] tests a name without
//! expanding anything, so `n[0-99999999]` costs no memory; an item may also hold the glob
//! wildcards `*` (any run of characters) and `?` (one character), which is how the status
//! view takes a host pattern and a host list in one field. [`compress`] writes a set of
//! names as the shortest such list of its trailing numbers.
//!
//! Limits keep every input cheap: an expression of at most [`MAX_EXPRESSION_LEN`] bytes,
//! numbers of at most [`MAX_DIGITS`] digits, and [`HostList::expand`] refuses to produce
//! more names than its caller allows.

use std::collections::BTreeMap;
use std::fmt;

/// The longest expression [`HostList::parse`] reads, in bytes.
pub const MAX_EXPRESSION_LEN: usize = 65_536;

/// The most digits a number in a bracket group (or a name's trailing number that
/// [`compress`] folds) may have: every such number fits a `u64`.
pub const MAX_DIGITS: usize = 18;

/// Why an expression is not a host list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostListError {
    /// The byte offset in the expression where the problem was found.
    pub offset: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for HostListError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "host list: {} (at byte {})", self.message, self.offset)
    }
}

impl std::error::Error for HostListError {}

/// One range of a bracket group: `lo..=hi`, written `width` digits wide (0: unpadded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Range {
    lo: u64,
    hi: u64,
    width: usize,
}

impl Range {
    /// Whether `digits` (all ASCII digits) is how this range writes one of its numbers.
    fn writes(&self, digits: &[u8]) -> bool {
        if digits.is_empty() || digits.len() > MAX_DIGITS {
            return false;
        }
        // A number is written with leading zeros only up to the range's width.
        if digits.len() > 1 && digits[0] == b'0' && digits.len() != self.width {
            return false;
        }
        if digits.len() < self.width {
            return false;
        }
        let value = digits
            .iter()
            .fold(0u64, |v, d| v * 10 + u64::from(d - b'0'));
        (self.lo..=self.hi).contains(&value)
    }

    fn count(&self) -> u64 {
        self.hi - self.lo + 1
    }
}

/// One part of an item.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    /// A character that must be there.
    Char(char),
    /// `?`: any one character.
    Any,
    /// `*`: any run of characters, also none.
    Star,
    /// `[...]`: a number out of these ranges.
    Group(Vec<Range>),
}

/// A parsed host list: the names of its items (see the [module](self) documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostList {
    items: Vec<Vec<Token>>,
}

impl HostList {
    /// Reads `expression`; anything that is not a host list is an error saying where and
    /// why. Whitespace around an item is ignored.
    pub fn parse(expression: &str) -> Result<HostList, HostListError> {
        if expression.len() > MAX_EXPRESSION_LEN {
            return Err(HostListError {
                offset: MAX_EXPRESSION_LEN,
                message: format!(
                    "longer than {MAX_EXPRESSION_LEN} bytes ({} bytes)",
                    expression.len()
                ),
            });
        }
        let mut items = Vec::new();
        let mut start = 0;
        let mut depth = 0usize;
        for (i, c) in expression.char_indices() {
            match c {
                '[' => depth += 1,
                ']' => depth = depth.saturating_sub(1),
                ',' if depth == 0 => {
                    items.push(parse_item(&expression[start..i], start)?);
                    start = i + 1;
                }
                _ => {}
            }
        }
        items.push(parse_item(&expression[start..], start)?);
        Ok(HostList { items })
    }

    /// Whether `name` is one of the list's names (or matches one of its patterns).
    pub fn matches(&self, name: &str) -> bool {
        let chars: Vec<char> = name.chars().collect();
        self.items.iter().any(|item| item_matches(item, &chars))
    }

    /// Whether the list holds wildcards (`*`, `?`), so that it names no finite set.
    pub fn has_wildcards(&self) -> bool {
        self.items
            .iter()
            .flatten()
            .any(|t| matches!(t, Token::Any | Token::Star))
    }

    /// How many names the list writes (counting a name twice when two items write it),
    /// `None` when it has wildcards or more than `u64::MAX` names.
    pub fn count(&self) -> Option<u64> {
        if self.has_wildcards() {
            return None;
        }
        self.items.iter().try_fold(0u64, |total, item| {
            let n = item.iter().try_fold(1u64, |n, t| match t {
                Token::Group(ranges) => n.checked_mul(
                    ranges
                        .iter()
                        .map(Range::count)
                        .try_fold(0u64, |a, b| a.checked_add(b))?,
                ),
                _ => Some(n),
            })?;
            total.checked_add(n)
        })
    }

    /// The names of the list in the order it writes them; an error when it has wildcards or
    /// more than `limit` names.
    pub fn expand(&self, limit: usize) -> Result<Vec<String>, HostListError> {
        if self.has_wildcards() {
            return Err(HostListError {
                offset: 0,
                message: "a pattern with '*' or '?' names no list of hosts".into(),
            });
        }
        match self.count() {
            Some(n) if n <= limit as u64 => {}
            _ => {
                return Err(HostListError {
                    offset: 0,
                    message: format!("expands to more than {limit} names"),
                });
            }
        }
        let mut names = Vec::new();
        for item in &self.items {
            let mut partial = vec![String::new()];
            for token in item {
                partial = match token {
                    Token::Char(c) => {
                        partial.iter_mut().for_each(|p| p.push(*c));
                        partial
                    }
                    Token::Group(ranges) => {
                        let mut next = Vec::new();
                        for p in &partial {
                            for r in ranges {
                                for v in r.lo..=r.hi {
                                    next.push(format!("{p}{v:0width$}", width = r.width));
                                }
                            }
                        }
                        next
                    }
                    Token::Any | Token::Star => unreachable!("wildcards were refused above"),
                };
            }
            names.extend(partial);
        }
        Ok(names)
    }
}

/// The most tokens one item may have: matching costs tokens × name length.
const MAX_TOKENS: usize = 256;

fn parse_item(text: &str, offset: usize) -> Result<Vec<Token>, HostListError> {
    let error = |at: usize, message: String| HostListError {
        offset: offset + at,
        message,
    };
    let lead = text.len() - text.trim_start().len();
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(error(
            0,
            "an empty item (two commas, or one at an end)".into(),
        ));
    }
    let mut tokens = Vec::new();
    let mut chars = trimmed.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let at = lead + i;
        match c {
            '[' => {
                let close = trimmed[i..]
                    .find(']')
                    .ok_or_else(|| error(at, "'[' without its ']'".into()))?;
                let inner = &trimmed[i + 1..i + close];
                tokens.push(Token::Group(parse_group(inner, offset + at + 1)?));
                while chars.peek().is_some_and(|(j, _)| *j <= i + close) {
                    chars.next();
                }
            }
            ']' => return Err(error(at, "']' without its '['".into())),
            '*' => tokens.push(Token::Star),
            '?' => tokens.push(Token::Any),
            c if c.is_whitespace() => {
                return Err(error(at, "whitespace inside an item".into()));
            }
            c => tokens.push(Token::Char(c)),
        }
        if tokens.len() > MAX_TOKENS {
            return Err(error(at, format!("an item longer than {MAX_TOKENS} parts")));
        }
    }
    Ok(tokens)
}

fn parse_group(inner: &str, offset: usize) -> Result<Vec<Range>, HostListError> {
    let error = |at: usize, message: String| HostListError {
        offset: offset + at,
        message,
    };
    if inner.contains('[') {
        return Err(error(0, "brackets inside brackets".into()));
    }
    let mut ranges = Vec::new();
    let mut at = 0;
    for part in inner.split(',') {
        let number = |text: &str, at: usize| -> Result<(u64, usize), HostListError> {
            let t = text.trim();
            if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
                return Err(error(
                    at,
                    format!(
                        "expected a number or a range like 01-10 in brackets, found {:?}",
                        crate::untrusted::Untrusted(text).capped(32)
                    ),
                ));
            }
            if t.len() > MAX_DIGITS {
                return Err(error(
                    at,
                    format!("a number longer than {MAX_DIGITS} digits"),
                ));
            }
            let width = if t.len() > 1 && t.starts_with('0') {
                t.len()
            } else {
                0
            };
            Ok((t.parse().expect("at most 18 digits fit a u64"), width))
        };
        let range = match part.split_once('-') {
            Some((lo, hi)) => {
                let (lo_v, width) = number(lo, at)?;
                let (hi_v, _) = number(hi, at + lo.len() + 1)?;
                if lo_v > hi_v {
                    return Err(error(at, format!("the range {lo_v}-{hi_v} runs backwards")));
                }
                Range {
                    lo: lo_v,
                    hi: hi_v,
                    width,
                }
            }
            None => {
                let (v, width) = number(part, at)?;
                Range {
                    lo: v,
                    hi: v,
                    width,
                }
            }
        };
        ranges.push(range);
        at += part.len() + 1;
    }
    Ok(ranges)
}

/// Whether `item` matches all of `name`: which tokens can have been matched after each
/// position of the name, one position after the other (no backtracking, so no input
/// costs more than tokens × characters × [`MAX_DIGITS`]).
fn item_matches(item: &[Token], name: &[char]) -> bool {
    let width = item.len() + 1;
    // reach[p * width + t]: the first t tokens can match name[..p].
    let mut reach = vec![false; (name.len() + 1) * width];
    reach[0] = true;
    for p in 0..=name.len() {
        for t in 0..item.len() {
            if !reach[p * width + t] {
                continue;
            }
            match &item[t] {
                Token::Char(c) => {
                    if name.get(p) == Some(c) {
                        reach[(p + 1) * width + t + 1] = true;
                    }
                }
                Token::Any => {
                    if p < name.len() {
                        reach[(p + 1) * width + t + 1] = true;
                    }
                }
                Token::Star => {
                    reach[p * width + t + 1] = true;
                    if p < name.len() {
                        reach[(p + 1) * width + t] = true;
                    }
                }
                Token::Group(ranges) => {
                    let digits: Vec<u8> = name[p..]
                        .iter()
                        .take(MAX_DIGITS)
                        .take_while(|c| c.is_ascii_digit())
                        .map(|&c| c as u8)
                        .collect();
                    for len in 1..=digits.len() {
                        if ranges.iter().any(|r| r.writes(&digits[..len])) {
                            reach[(p + len) * width + t + 1] = true;
                        }
                    }
                }
            }
        }
    }
    reach[name.len() * width + item.len()]
}

/// Characters that mean something in a host list: a name holding one is written as it is,
/// outside any range (and then reads back as a pattern or not at all).
const SPECIAL: [char; 5] = ['[', ']', ',', '*', '?'];

/// Writes `names` as a host list: names that differ only in their last number are folded
/// into one item with a bracket group (`f0101 f0102 f0201` → `f[0101-0102,0201]`). Items
/// are ordered by their text around the number, then by number; a name given twice is
/// written once. Names holding `[ ] , * ?` (which cannot be written in a list) are appended
/// as they are.
pub fn compress<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    // (prefix, suffix, digits) → numbers; digits is the written length of the number.
    let mut by_length: BTreeMap<(&str, &str, usize), Vec<u64>> = BTreeMap::new();
    let mut plain: Vec<&str> = Vec::new();
    for name in names {
        if name.contains(SPECIAL) {
            plain.push(name);
            continue;
        }
        match last_number(name) {
            Some((start, end)) => {
                let value = name[start..end].parse().expect("checked digits");
                by_length
                    .entry((&name[..start], &name[end..], end - start))
                    .or_default()
                    .push(value);
            }
            None => plain.push(name),
        }
    }
    // Numbers of one length without leading zeros read the same unpadded, so lengths fold
    // together; a length some number of which has a leading zero keeps its width.
    let mut groups: BTreeMap<(&str, &str, usize), Vec<u64>> = BTreeMap::new();
    for ((prefix, suffix, digits), values) in by_length {
        let padded = digits > 1 && values.iter().any(|&v| v < 10u64.pow(digits as u32 - 1));
        let width = if padded { digits } else { 0 };
        groups
            .entry((prefix, suffix, width))
            .or_default()
            .extend(values);
    }
    // (prefix, suffix, smallest number, text): items read in the order of their numbers.
    let mut items: Vec<(&str, &str, u64, String)> = Vec::new();
    for ((prefix, suffix, width), mut values) in groups {
        values.sort_unstable();
        values.dedup();
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for v in values {
            match runs.last_mut() {
                Some((_, hi)) if *hi + 1 == v => *hi = v,
                _ => runs.push((v, v)),
            }
        }
        let written: Vec<String> = runs
            .iter()
            .map(|&(lo, hi)| {
                if lo == hi {
                    format!("{lo:0width$}")
                } else {
                    format!("{lo:0width$}-{hi:0width$}")
                }
            })
            .collect();
        let text = if runs.len() == 1 && runs[0].0 == runs[0].1 {
            format!("{prefix}{}{suffix}", written[0])
        } else {
            format!("{prefix}[{}]{suffix}", written.join(","))
        };
        items.push((prefix, suffix, runs[0].0, text));
    }
    items.sort();
    let mut out: Vec<String> = items.into_iter().map(|(_, _, _, text)| text).collect();
    plain.sort_unstable();
    plain.dedup();
    out.extend(plain.into_iter().map(str::to_owned));
    out.join(",")
}

/// The byte range of `name`'s last run of digits, if it has one of at most [`MAX_DIGITS`].
fn last_number(name: &str) -> Option<(usize, usize)> {
    let bytes = name.as_bytes();
    let end = bytes.iter().rposition(u8::is_ascii_digit)? + 1;
    let start = bytes[..end]
        .iter()
        .rposition(|b| !b.is_ascii_digit())
        .map_or(0, |i| i + 1);
    (end - start <= MAX_DIGITS).then_some((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand(e: &str) -> Vec<String> {
        HostList::parse(e).unwrap().expand(10_000).unwrap()
    }

    #[test]
    fn slurm_forms_expand() {
        assert_eq!(
            expand("f[0101-0103,0201]"),
            ["f0101", "f0102", "f0103", "f0201"]
        );
        assert_eq!(expand("n[8-10]"), ["n8", "n9", "n10"]);
        assert_eq!(expand("n[08-10]"), ["n08", "n09", "n10"]);
        assert_eq!(
            expand("r[1-2]n[01-02]"),
            ["r1n01", "r1n02", "r2n01", "r2n02"]
        );
        assert_eq!(expand("login1, a[1-2]-ib"), ["login1", "a1-ib", "a2-ib"]);
        assert_eq!(expand("host"), ["host"]);
    }

    #[test]
    fn bad_lists_say_where_and_why() {
        for (e, why, at) in [
            ("f[1-2", "without its ']'", 1),
            ("f1-2]", "without its '['", 4),
            ("f[2-1]", "runs backwards", 2),
            ("f[a]", "expected a number", 2),
            ("f[]", "expected a number", 2),
            ("a,,b", "empty item", 2),
            ("f[1[2]]", "inside brackets", 2),
            ("f[1234567890123456789]", "longer than 18 digits", 2),
            ("a b", "whitespace", 1),
        ] {
            let err = HostList::parse(e).unwrap_err();
            assert!(err.message.contains(why), "{e}: {err}");
            assert_eq!(err.offset, at, "{e}: {err}");
        }
        let huge = HostList::parse("n[0-99999999999]").unwrap();
        assert_eq!(huge.count(), Some(100_000_000_000));
        assert!(
            huge.expand(1000)
                .unwrap_err()
                .message
                .contains("more than 1000")
        );
    }

    #[test]
    fn matching_follows_the_widths_and_the_wildcards() {
        let l = HostList::parse("f[0101-0188,0201],n[8-10],login*,gpu?").unwrap();
        for yes in [
            "f0101", "f0150", "f0201", "n8", "n10", "login", "login07", "gpu1",
        ] {
            assert!(l.matches(yes), "{yes}");
        }
        for no in [
            "f101", "f0189", "f00101", "n08", "n11", "gpu", "gpu12", "xlogin",
        ] {
            assert!(!l.matches(no), "{no}");
        }
        assert!(HostList::parse("*[1-3]*").unwrap().matches("a2b"));
        assert!(HostList::parse("[1-2][3-4]").unwrap().matches("24"));
        assert!(!HostList::parse("[1-2][3-4]").unwrap().matches("25"));
        assert!(HostList::parse("n[1-100]").unwrap().matches("n100"));
    }

    #[test]
    fn compress_writes_ranges() {
        assert_eq!(
            compress(["f0201", "f0101", "f0102", "f0103", "f0102"]),
            "f[0101-0103,0201]"
        );
        assert_eq!(compress(["n9", "n10", "n11"]), "n[9-11]");
        assert_eq!(compress(["n09", "n10", "n100"]), "n[09-10],n100");
        assert_eq!(
            compress(["cl01n0008", "cl01n0028", "cl01n0029"]),
            "cl01n[0008,0028-0029]"
        );
        assert_eq!(
            compress(["login", "a1-ib", "a2-ib", "x[1]"]),
            "a[1-2]-ib,login,x[1]"
        );
        assert_eq!(compress(["f0"]), "f0");
        assert_eq!(compress(Vec::<&str>::new()), "");
    }

    fn name() -> impl proptest::strategy::Strategy<Value = String> {
        "[a-c]{0,2}[0-9]{0,5}(-[a-b0-9]{1,2})?".prop_filter("non-empty", |s| !s.is_empty())
    }

    use proptest::strategy::Strategy;

    proptest::proptest! {
        /// A compressed list expands to exactly its names and matches each of them.
        #[test]
        fn compress_round_trips(names in proptest::collection::vec(name(), 1..40)) {
            let written = compress(names.iter().map(String::as_str));
            let list = HostList::parse(&written).unwrap();
            let mut back = list.expand(100_000).unwrap();
            back.sort();
            let mut want = names.clone();
            want.sort();
            want.dedup();
            proptest::prop_assert_eq!(&back, &want, "{}", written);
            for n in &names {
                proptest::prop_assert!(list.matches(n), "{} in {}", n, written);
            }
        }

        /// Matching agrees with expansion for every name the list writes and near misses.
        #[test]
        fn matching_agrees_with_expansion(lo in 0u64..120, len in 0u64..30, pad in 0usize..4, probe in 0u64..200) {
            let hi = lo + len;
            let e = format!("n[{lo:0pad$}-{hi:0pad$}]");
            let list = HostList::parse(&e).unwrap();
            let names = list.expand(1000).unwrap();
            for w in 0..4 {
                let candidate = format!("n{probe:0w$}");
                proptest::prop_assert_eq!(list.matches(&candidate), names.contains(&candidate), "{} {}", e, candidate);
            }
        }

        /// Any text is parsed or refused, never a panic, and a parsed list matches any name.
        #[test]
        fn arbitrary_text_never_panics(e in "\\PC{0,40}", n in "\\PC{0,20}") {
            if let Ok(list) = HostList::parse(&e) {
                let _ = list.matches(&n);
                let _ = list.count();
                let _ = list.expand(1000);
            }
        }
    }
}

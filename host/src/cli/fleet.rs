//! `ccfleet fleet status`: the fleet as a fleet server sees it, from
//! `GET /api/fleet/instances`, as a table grouped by cluster and service type (or JSON),
//! once or on an interval; or its summary from `GET /api/fleet/summary` (counts per cluster
//! and type, the unwell hosts as host lists), which is also what a large fleet shows when
//! no filter is given.
//!
//! The token comes from `CC_FLEET_TOKEN` or the file named by `CC_FLEET_TOKEN_FILE`, never
//! from a flag (a flag shows in process listings); it needs cc-backend's `admin` or
//! `support` role. Colour only when standard output is a terminal and `NO_COLOR` is unset.

use std::collections::BTreeMap;
use std::io::{IsTerminal as _, Write as _};
use std::time::Duration;

use anyhow::{Context as _, bail};
use ccfleet::untrusted::Untrusted;
use serde::{Deserialize, Serialize};

/// The variable holding the token.
const ENV_TOKEN: &str = "CC_FLEET_TOKEN";
/// How much of a name a table cell shows.
const NAME_CAP: usize = 64;
/// How much of a host list a summary line shows.
const HOSTS_CAP: usize = 2000;
/// A fleet with more members than this shows its summary when no filter is given.
pub const LARGE_FLEET: u64 = 200;

/// Flags of `ccfleet fleet`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to do.
    #[command(subcommand)]
    pub command: FleetCommand,
}

/// The subcommands of `ccfleet fleet`.
#[derive(Debug, clap::Subcommand)]
pub enum FleetCommand {
    /// Show the fleet's instances: state, heartbeat age, configuration revision served.
    Status(StatusArgs),
}

/// Flags of `ccfleet fleet status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// The fleet server's base URL, e.g. http://127.0.0.1:8080.
    #[arg(long)]
    url: String,
    /// Only this cluster (repeatable: any of them).
    #[arg(long)]
    cluster: Vec<String>,
    /// Only this service type, e.g. ccmc (repeatable).
    #[arg(long = "type", value_name = "TYPE")]
    service_type: Vec<String>,
    /// Only this state: pending, active or stale (repeatable).
    #[arg(long)]
    state: Vec<String>,
    /// Only this host name (repeatable).
    #[arg(long)]
    hostname: Vec<String>,
    /// Only hosts of this host list or pattern, e.g. 'f[0101-0188,0201]' or 'login*'
    /// (repeatable).
    #[arg(long, value_parser = host_list)]
    host: Vec<String>,
    /// Only members reporting a plugin whose SHA-256 starts with these hex digits, running
    /// or failing (repeatable).
    #[arg(long = "plugin-version", value_name = "SHA256_PREFIX")]
    plugin_version: Vec<String>,
    /// Only members reporting a failed plugin.
    #[arg(long)]
    failing: bool,
    /// Only members whose identity another agent claims.
    #[arg(long)]
    duplicate: bool,
    /// Show counts per cluster and type and the unwell hosts as host lists (the default
    /// for a fleet of more than 200 members when no filter is given).
    #[arg(long, conflicts_with = "all")]
    summary: bool,
    /// List every member even of a large fleet.
    #[arg(long)]
    all: bool,
    /// Print the server's JSON instead of a table (with --watch, one document per line).
    #[arg(long)]
    json: bool,
    /// Show the status again every --interval until interrupted.
    #[arg(long)]
    watch: bool,
    /// How often --watch asks, as a Go duration.
    #[arg(long, default_value = "5s", value_parser = super::positive_duration)]
    interval: Duration,
    /// How long one request may take, as a Go duration.
    #[arg(long, default_value = "10s", value_parser = super::positive_duration)]
    timeout: Duration,
}

/// The answer of `GET /api/fleet/instances`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Answer {
    /// The server's clock (Unix seconds); ages are computed against it.
    pub now: i64,
    /// The server's `stale-after`, in seconds.
    #[serde(default)]
    pub stale_after_seconds: u64,
    /// The instances.
    pub instances: Vec<Instance>,
}

/// The answer of `GET /api/fleet/summary`, in the compact form a server answers by default
/// or the full form of a server from before it: read as either, printed (`--json`) as it
/// came.
#[derive(Debug, Clone)]
pub struct SummaryAnswer {
    /// The server's clock (Unix seconds).
    pub now: i64,
    /// The summary, in its full form.
    pub summary: ccfleet::server::status::summary::Summary,
    /// The answer as the server sent it.
    raw: serde_json::Value,
}

impl<'de> Deserialize<'de> for SummaryAnswer {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let raw = serde_json::Value::deserialize(d)?;
        let now = raw
            .get("now")
            .and_then(serde_json::Value::as_i64)
            .ok_or_else(|| D::Error::missing_field("now"))?;
        let summary = ccfleet::server::status::compact::EitherForm::deserialize(&raw)
            .map_err(D::Error::custom)?
            .into_full();
        Ok(SummaryAnswer { now, summary, raw })
    }
}

impl Serialize for SummaryAnswer {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.raw.serialize(s)
    }
}

/// A `--host` value: a host list or pattern the server will take.
fn host_list(text: &str) -> Result<String, String> {
    ccfleet::hostlist::HostList::parse(text)
        .map(|_| text.to_owned())
        .map_err(|e| e.to_string())
}

/// One instance as the server lists it.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Instance {
    /// The cluster; empty for infra members.
    #[serde(default)]
    pub cluster: String,
    /// The host name.
    pub hostname: String,
    /// The service type's code.
    pub service_type: String,
    /// `pending`, `active` or `stale`.
    pub state: String,
    /// Unix seconds of the registration.
    pub registered_at: i64,
    /// Unix seconds of the last heartbeat, if any.
    #[serde(default)]
    pub last_heartbeat: Option<i64>,
    /// The configuration revision served, if any.
    #[serde(default)]
    pub config_revision: Option<String>,
    /// The abbreviated instance id.
    pub instance: String,
    /// Whether another agent claims the same identity.
    #[serde(default)]
    pub duplicate: bool,
}

/// Runs `ccfleet fleet ...`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        FleetCommand::Status(args) => status(args).await,
    }
}

/// Whether any filter is given.
fn filtered(args: &StatusArgs) -> bool {
    !(args.cluster.is_empty()
        && args.service_type.is_empty()
        && args.state.is_empty()
        && args.hostname.is_empty()
        && args.host.is_empty()
        && args.plugin_version.is_empty()
        && !args.failing
        && !args.duplicate)
}

/// The request URL of the instances: the base URL, the route and the filters.
fn instances_url(args: &StatusArgs) -> anyhow::Result<reqwest::Url> {
    route_url(args, "instances")
}

/// The request URL of `/api/fleet/<route>` with the filters.
fn route_url(args: &StatusArgs, route: &str) -> anyhow::Result<reqwest::Url> {
    let base = args.url.trim_end_matches('/');
    let mut url = reqwest::Url::parse(&format!("{base}/api/fleet/{route}"))
        .with_context(|| format!("--url {:?} is not a URL", args.url))?;
    if !matches!(url.scheme(), "http" | "https") {
        bail!("--url {:?}: the scheme must be http or https", args.url);
    }
    {
        let mut query = url.query_pairs_mut();
        for (key, values) in [
            ("cluster", &args.cluster),
            ("type", &args.service_type),
            ("state", &args.state),
            ("hostname", &args.hostname),
            ("host", &args.host),
            ("version", &args.plugin_version),
        ] {
            for value in values {
                query.append_pair(key, value);
            }
        }
        for (key, on) in [("failing", args.failing), ("duplicate", args.duplicate)] {
            if on {
                query.append_pair(key, "true");
            }
        }
    }
    if url.query() == Some("") {
        url.set_query(None);
    }
    Ok(url)
}

async fn status(args: StatusArgs) -> anyhow::Result<()> {
    let url = instances_url(&args)?;
    let summary_url = route_url(&args, "summary")?;
    let token = ccfleet::secret::from_env(ENV_TOKEN, "").context("reading the token")?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .timeout(args.timeout)
        .build()
        .context("building the HTTP client")?;
    let colour = std::io::stdout().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let fetcher = Fetcher {
        client: &client,
        token: &token,
        shown_url: &args.url,
    };
    // The summary when asked for, or when a table of everything would be too long to read.
    let mut summarise = args.summary;
    if !summarise
        && !args.all
        && !args.json
        && !filtered(&args)
        && let Some(answer) = fetcher.get::<SummaryAnswer>(&summary_url, None).await?.0
    {
        let t = &answer.summary.total;
        summarise = t.pending + t.active + t.stale > LARGE_FLEET;
    }
    let mut tag: Option<String> = None;
    let mut ticker = tokio::time::interval(args.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if args.watch {
            tokio::select! {
                _ = ticker.tick() => {}
                r = tokio::signal::ctrl_c() => return r.context("waiting for Ctrl-C"),
            }
        }
        // With --watch an unchanged answer (304) is not printed again.
        let shown = if summarise {
            fetcher
                .get::<SummaryAnswer>(&summary_url, tag.as_deref())
                .await
                .and_then(|(answer, t)| {
                    tag = t;
                    match answer {
                        Some(a) => show_summary(&a, args.json, colour, args.watch),
                        None => Ok(()),
                    }
                })
        } else {
            fetcher
                .get::<Answer>(&url, tag.as_deref())
                .await
                .and_then(|(answer, t)| {
                    tag = t;
                    match answer {
                        Some(a) => show(&a, args.json, colour, args.watch),
                        None => Ok(()),
                    }
                })
        };
        match shown {
            Ok(()) if !args.watch => return Ok(()),
            Ok(()) => {}
            Err(e) if !args.watch => return Err(e),
            // A failed round is reported and the next one tried: a server restart must not
            // end the watch.
            Err(e) => eprintln!("ccfleet: {}", super::one_line(&e)),
        }
    }
}

/// What every request of one run shares.
struct Fetcher<'a> {
    client: &'a reqwest::Client,
    token: &'a str,
    shown_url: &'a str,
}

impl Fetcher<'_> {
    /// Asks `url`, with `If-None-Match: tag` when given: `None` when the server answers
    /// that nothing changed, and the answer's tag.
    async fn get<T: serde::de::DeserializeOwned>(
        &self,
        url: &reqwest::Url,
        tag: Option<&str>,
    ) -> anyhow::Result<(Option<T>, Option<String>)> {
        fetch(self.client, url, self.token, self.shown_url, tag).await
    }
}

/// Asks the server once; an answer other than 200 (or 304 to `tag`) is an error saying
/// what to fix.
async fn fetch<T: serde::de::DeserializeOwned>(
    client: &reqwest::Client,
    url: &reqwest::Url,
    token: &str,
    shown_url: &str,
    tag: Option<&str>,
) -> anyhow::Result<(Option<T>, Option<String>)> {
    let mut request = client.get(url.clone());
    if !token.is_empty() {
        request = request.header("X-Auth-Token", token);
    }
    if let Some(tag) = tag {
        request = request.header("If-None-Match", tag);
    }
    let response = request
        .send()
        .await
        .with_context(|| format!("asking the fleet server at {shown_url}"))?;
    let status = response.status();
    let answered_tag = response
        .headers()
        .get("etag")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if status == reqwest::StatusCode::NOT_MODIFIED && tag.is_some() {
        return Ok((None, answered_tag));
    }
    let body = response
        .bytes()
        .await
        .with_context(|| format!("reading the answer of {shown_url}"))?;
    if status.is_success() {
        let answer = serde_json::from_slice(&body)
            .with_context(|| format!("the answer of {shown_url} is not a fleet status"))?;
        return Ok((Some(answer), answered_tag));
    }
    // cc-backend's error body: {"status": ..., "error": ...}.
    let reason = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
        .unwrap_or_default();
    let reason = Untrusted(&reason).capped(200).to_string();
    match status.as_u16() {
        401 if token.is_empty() => bail!(
            "{shown_url} answered 401 ({reason}): set CC_FLEET_TOKEN or CC_FLEET_TOKEN_FILE to a token with the admin or support role"
        ),
        401 => bail!("{shown_url} refused the token with 401: {reason}"),
        403 => bail!(
            "{shown_url} answered 403 ({reason}): the token needs the admin or support role; node tokens (role api) cannot read the fleet's status"
        ),
        404 => bail!(
            "{shown_url} answered 404: no fleet status there (is it a ccfleet server, and the base URL without a path?)"
        ),
        code => bail!("{shown_url} answered {code}: {reason}"),
    }
}

fn show(answer: &Answer, json: bool, colour: bool, watching: bool) -> anyhow::Result<()> {
    let text = if json {
        let mut line = if watching {
            serde_json::to_string(answer)?
        } else {
            serde_json::to_string_pretty(answer)?
        };
        line.push('\n');
        line
    } else {
        render(answer, colour)
    };
    print(text, json, colour, watching)
}

fn show_summary(
    answer: &SummaryAnswer,
    json: bool,
    colour: bool,
    watching: bool,
) -> anyhow::Result<()> {
    let text = if json {
        let mut line = if watching {
            serde_json::to_string(answer)?
        } else {
            serde_json::to_string_pretty(answer)?
        };
        line.push('\n');
        line
    } else {
        render_summary(answer, colour)
    };
    print(text, json, colour, watching)
}

/// The summary: one line of counts per cluster and type, then its unwell hosts.
pub fn render_summary(answer: &SummaryAnswer, colour: bool) -> String {
    let summary = &answer.summary;
    let t = &summary.total;
    if summary.groups.is_empty() {
        return "no instance is registered (or none passes the filters)\n".to_owned();
    }
    let counts = |c: &ccfleet::server::status::summary::Counts| {
        let mut parts: Vec<String> = [
            ("active", c.active),
            ("stale", c.stale),
            ("pending", c.pending),
        ]
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(s, n)| format!("{n} {}", paint(s, colour)))
        .collect();
        for (what, n) in [("failing", c.failing), ("duplicate", c.duplicate)] {
            if n > 0 {
                parts.push(format!("{n} {what}"));
            }
        }
        parts.join(", ")
    };
    let mut out = format!(
        "{} members: {}\n",
        t.active + t.stale + t.pending,
        counts(t)
    );
    for g in &summary.groups {
        let cluster = if g.cluster.is_empty() {
            "infra".to_owned()
        } else {
            Untrusted(&g.cluster).capped(NAME_CAP).to_string()
        };
        out.push_str(&format!(
            "{cluster} / {}: {}",
            Untrusted(&g.service_type).capped(NAME_CAP),
            counts(&g.counts)
        ));
        if let Some(since) = g.oldest_stale_since {
            out.push_str(&format!(
                " (oldest stale: last seen {})",
                age(answer.now, Some(since))
            ));
        }
        out.push('\n');
        for (what, hosts) in [
            ("stale", &g.hosts.stale),
            ("pending", &g.hosts.pending),
            ("failing", &g.hosts.failing),
            ("duplicate", &g.hosts.duplicate),
        ] {
            if !hosts.is_empty() {
                out.push_str(&format!(
                    "  {what:<9} {}\n",
                    Untrusted(hosts).capped(HOSTS_CAP)
                ));
            }
        }
    }
    out
}

/// Writes a rendered status; with --watch on a terminal in place of the last one.
fn print(mut text: String, json: bool, colour: bool, watching: bool) -> anyhow::Result<()> {
    if watching && !json {
        text = if colour {
            // A terminal shows the latest table in place.
            format!("\x1b[H\x1b[2J{text}")
        } else {
            format!("{text}\n")
        };
    }
    super::write_stdout(text.as_bytes())?;
    let _ = std::io::stdout().flush();
    Ok(())
}

/// An age as people read it: `12 s ago`, `3 min ago`, `5 h ago`, `2 d ago`, or `never`.
pub fn age(now: i64, then: Option<i64>) -> String {
    let Some(then) = then else {
        return "never".to_owned();
    };
    let s = now.saturating_sub(then).max(0);
    match s {
        0..120 => format!("{s} s ago"),
        120..7200 => format!("{} min ago", s / 60),
        7200..172_800 => format!("{} h ago", s / 3600),
        _ => format!("{} d ago", s / 86_400),
    }
}

fn paint(state: &str, colour: bool) -> String {
    let code = match state {
        "active" => "32",
        "pending" => "33",
        "stale" => "31",
        _ => return state.to_owned(),
    };
    if colour {
        format!("\x1b[{code}m{state}\x1b[0m")
    } else {
        state.to_owned()
    }
}

/// The table: one block per cluster and type, each headed by its counts.
pub fn render(answer: &Answer, colour: bool) -> String {
    if answer.instances.is_empty() {
        return "no instance is registered\n".to_owned();
    }
    let mut groups: BTreeMap<(&str, &str), Vec<&Instance>> = BTreeMap::new();
    for i in &answer.instances {
        groups
            .entry((i.cluster.as_str(), i.service_type.as_str()))
            .or_default()
            .push(i);
    }
    const HEADER: [&str; 6] = [
        "HOST",
        "STATE",
        "LAST HEARTBEAT",
        "REGISTERED",
        "CONFIG REVISION",
        "INSTANCE",
    ];
    let mut out = String::new();
    for ((cluster, service_type), members) in groups {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for m in &members {
            *counts.entry(m.state.as_str()).or_default() += 1;
        }
        let counts: Vec<String> = ["active", "pending", "stale"]
            .into_iter()
            .filter_map(|s| counts.get(s).map(|n| format!("{n} {s}")))
            .collect();
        let cluster = if cluster.is_empty() {
            "infra".to_owned()
        } else {
            Untrusted(cluster).capped(NAME_CAP).to_string()
        };
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&format!(
            "{cluster} / {}: {}\n",
            Untrusted(service_type).capped(NAME_CAP),
            counts.join(", ")
        ));
        let rows: Vec<[String; 6]> = members
            .iter()
            .map(|m| {
                let mut instance = Untrusted(&m.instance).capped(NAME_CAP).to_string();
                if m.duplicate {
                    instance.push_str("  DUPLICATE");
                }
                [
                    Untrusted(&m.hostname).capped(NAME_CAP).to_string(),
                    Untrusted(&m.state).capped(NAME_CAP).to_string(),
                    age(answer.now, m.last_heartbeat),
                    age(answer.now, Some(m.registered_at)),
                    m.config_revision
                        .as_deref()
                        .map(|r| Untrusted(r).capped(NAME_CAP).to_string())
                        .unwrap_or_else(|| "none".to_owned()),
                    instance,
                ]
            })
            .collect();
        let mut widths = HEADER.map(|h| h.chars().count());
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let mut line = |cells: [&str; 6], painted_state: Option<String>| {
            let mut text = String::from("  ");
            for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
                if i > 0 {
                    text.push_str("  ");
                }
                // Padding is computed on the plain word: colour codes take no columns.
                let shown = match (&painted_state, i) {
                    (Some(p), 1) => p.as_str(),
                    _ => cell,
                };
                text.push_str(shown);
                if i + 1 < cells.len() {
                    text.extend(std::iter::repeat_n(
                        ' ',
                        w.saturating_sub(cell.chars().count()),
                    ));
                }
            }
            out.push_str(text.trim_end());
            out.push('\n');
        };
        line(HEADER, None);
        for row in &rows {
            line(
                [&row[0], &row[1], &row[2], &row[3], &row[4], &row[5]],
                Some(paint(&row[1], colour)),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(cluster: &str, host: &str, ty: &str, state: &str) -> Instance {
        Instance {
            cluster: cluster.into(),
            hostname: host.into(),
            service_type: ty.into(),
            state: state.into(),
            registered_at: 1_000,
            last_heartbeat: (state != "pending").then_some(1_988),
            config_revision: (state == "active").then(|| "9223372036854775807".into()),
            instance: "0123…cdef".into(),
            duplicate: host == "twin",
        }
    }

    #[test]
    fn ages_read_as_people_say_them() {
        assert_eq!(age(100, Some(88)), "12 s ago");
        assert_eq!(
            age(100, Some(200)),
            "0 s ago",
            "a clock ahead is not a negative age"
        );
        assert_eq!(age(10_000, Some(10_000 - 180)), "3 min ago");
        assert_eq!(age(100_000, Some(100_000 - 5 * 3600)), "5 h ago");
        assert_eq!(age(1_000_000, Some(1_000_000 - 3 * 86_400)), "3 d ago");
        assert_eq!(age(1, None), "never");
    }

    #[test]
    fn the_table_is_grouped_by_cluster_and_type() {
        let answer = Answer {
            now: 2_000,
            stale_after_seconds: 90,
            instances: vec![
                instance("fritz", "f0102", "ccmc", "stale"),
                instance("fritz", "f0101", "ccmc", "active"),
                instance("", "mgmt", "ccb", "pending"),
                instance("alex", "twin", "ccmc", "active"),
            ],
        };
        let text = render(&answer, false);
        let expected = "\
infra / ccb: 1 pending
  HOST  STATE    LAST HEARTBEAT  REGISTERED  CONFIG REVISION  INSTANCE
  mgmt  pending  never           16 min ago  none             0123…cdef

alex / ccmc: 1 active
  HOST  STATE   LAST HEARTBEAT  REGISTERED  CONFIG REVISION      INSTANCE
  twin  active  12 s ago        16 min ago  9223372036854775807  0123…cdef  DUPLICATE

fritz / ccmc: 1 active, 1 stale
  HOST   STATE   LAST HEARTBEAT  REGISTERED  CONFIG REVISION      INSTANCE
  f0102  stale   12 s ago        16 min ago  none                 0123…cdef
  f0101  active  12 s ago        16 min ago  9223372036854775807  0123…cdef
";
        assert_eq!(text, expected);
        assert!(!text.contains('\x1b'));
        let coloured = render(&answer, true);
        assert!(
            coloured.contains("\x1b[32mactive\x1b[0m  12 s ago"),
            "{coloured}"
        );
        assert!(
            coloured.contains("\x1b[31mstale\x1b[0m   12 s ago"),
            "{coloured}"
        );
    }

    #[test]
    fn hostile_names_are_escaped() {
        let answer = Answer {
            now: 0,
            stale_after_seconds: 90,
            instances: vec![instance("c", "evil\n\x1b[2Jx", "ccmc", "active")],
        };
        let text = render(&answer, false);
        assert!(text.contains(r"evil\n\u{1b}[2Jx"), "{text}");
        assert!(!text.contains('\x1b'));
    }

    #[test]
    fn filters_become_the_query() {
        let args = StatusArgs {
            url: "http://127.0.0.1:8080/".into(),
            cluster: vec!["fritz".into()],
            service_type: vec![],
            state: vec!["active".into(), "stale".into()],
            hostname: vec!["a&b".into()],
            host: vec!["f[01-02]".into()],
            plugin_version: vec![],
            failing: true,
            duplicate: false,
            summary: false,
            all: false,
            json: false,
            watch: false,
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(5),
        };
        assert_eq!(
            instances_url(&args).unwrap().as_str(),
            "http://127.0.0.1:8080/api/fleet/instances?cluster=fritz&state=active&state=stale&hostname=a%26b&host=f%5B01-02%5D&failing=true"
        );
        assert!(filtered(&args));
        let bare = StatusArgs {
            cluster: vec![],
            state: vec![],
            hostname: vec![],
            host: vec![],
            failing: false,
            ..args
        };
        assert!(!filtered(&bare));
        assert_eq!(
            route_url(&bare, "summary").unwrap().as_str(),
            "http://127.0.0.1:8080/api/fleet/summary"
        );
        assert_eq!(
            instances_url(&bare).unwrap().as_str(),
            "http://127.0.0.1:8080/api/fleet/instances"
        );
        let ftp = StatusArgs {
            url: "ftp://x".into(),
            ..bare
        };
        assert!(instances_url(&ftp).is_err());
    }

    #[test]
    fn the_summary_shows_counts_and_host_lists() {
        let answer: SummaryAnswer = serde_json::from_value(serde_json::json!({
            "now": 10_000,
            "staleAfterSeconds": 90,
            "total": {"pending": 1, "active": 500, "stale": 3, "duplicate": 0, "failing": 1},
            "groups": [{
                "cluster": "fritz", "serviceType": "ccmc",
                "counts": {"pending": 1, "active": 500, "stale": 3, "duplicate": 0, "failing": 1},
                "hosts": {"pending": "f0999", "stale": "f[0101-0102,0201]", "duplicate": "",
                          "failing": "f0300"},
                "oldestStaleSince": 10_000 - 7_300
            }]
        }))
        .unwrap();
        assert_eq!(
            render_summary(&answer, false),
            "\
504 members: 500 active, 3 stale, 1 pending, 1 failing
fritz / ccmc: 500 active, 3 stale, 1 pending, 1 failing (oldest stale: last seen 2 h ago)
  stale     f[0101-0102,0201]
  pending   f0999
  failing   f0300
"
        );
        assert!(host_list("f[1-").unwrap_err().contains("without its ']'"));

        // The compact form a server answers by default reads the same, and prints as sent.
        let compact = serde_json::json!({
            "now": 10_000,
            "staleAfterSeconds": 90,
            "v": 2,
            "total": {"pending": 1, "active": 500, "stale": 3, "failing": 1},
            "groups": [{
                "cluster": "fritz", "type": "ccmc", "active": 500,
                "stale": [3, "f[0101-0102,0201]", 10_000 - 7_300],
                "pending": [1, "f0999"], "failing": [1, "f0300"]
            }]
        });
        let read: SummaryAnswer = serde_json::from_value(compact.clone()).unwrap();
        assert_eq!(read.summary, answer.summary);
        assert_eq!(render_summary(&read, false), render_summary(&answer, false));
        assert_eq!(serde_json::to_value(&read).unwrap(), compact);
        assert!(serde_json::from_value::<SummaryAnswer>(serde_json::json!({"now": 1})).is_err());
    }
}

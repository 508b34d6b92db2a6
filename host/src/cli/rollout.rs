//! `ccfleet rollout status|pause|resume|abort`: staged rollouts as the fleet server sees
//! them, and an operator's hand on them (`GET /api/fleet/rollouts`, `POST
//! /api/fleet/rollouts/{name}/{action}`).
//!
//! The token comes from `CC_FLEET_TOKEN` or the file named by `CC_FLEET_TOKEN_FILE`, never
//! from the command line (where `ps` would show it): `status` needs the `admin` or
//! `support` role, the actions `admin`.

use std::time::Duration;

use anyhow::{Context as _, bail};
use ccfleet::untrusted::Untrusted;
use serde_json::Value;

const ENV_TOKEN: &str = "CC_FLEET_TOKEN";

/// Flags of `ccfleet rollout`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to do.
    #[command(subcommand)]
    pub command: RolloutCommand,
    /// The fleet server's base URL, e.g. http://cc-backend:8080.
    #[arg(long, global = true, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// Print the server's JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    /// How long one request may take.
    #[arg(long, global = true, default_value = "10s", value_parser = super::positive_duration)]
    timeout: Duration,
}

/// The subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum RolloutCommand {
    /// Every rollout: stage, status, the current stage's members by how they fare, and the
    /// last decision with its reason.
    Status,
    /// Stop a running rollout at its stage; reached members keep the change.
    Pause {
        /// The rollout (its file's name in the configuration tree's `rollouts/`).
        name: String,
    },
    /// Continue a paused rollout from its stage.
    Resume {
        /// The rollout.
        name: String,
    },
    /// Take the change back from every member; final.
    Abort {
        /// The rollout.
        name: String,
    },
}

/// Runs `ccfleet rollout`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let base = args.url.trim_end_matches('/');
    let parsed =
        reqwest::Url::parse(base).with_context(|| format!("--url {:?} is not a URL", args.url))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        bail!("--url {:?}: the scheme must be http or https", args.url);
    }
    let token = ccfleet::secret::from_env(ENV_TOKEN, "").context("reading the token")?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .timeout(args.timeout)
        .build()
        .context("building the HTTP client")?;
    let (request, role) = match &args.command {
        RolloutCommand::Status => (
            client.get(format!("{base}/api/fleet/rollouts")),
            "admin or support",
        ),
        RolloutCommand::Pause { name }
        | RolloutCommand::Resume { name }
        | RolloutCommand::Abort { name } => {
            let action = match args.command {
                RolloutCommand::Pause { .. } => "pause",
                RolloutCommand::Resume { .. } => "resume",
                _ => "abort",
            };
            let mut url = parsed.clone();
            url.path_segments_mut()
                .map_err(|()| anyhow::anyhow!("--url {:?} cannot take a path", args.url))?
                .pop_if_empty()
                .extend(["api", "fleet", "rollouts", name, action]);
            (client.post(url), "admin")
        }
    };
    let request = if token.is_empty() {
        request
    } else {
        request.header("X-Auth-Token", &token)
    };
    let response = request
        .send()
        .await
        .with_context(|| format!("asking the fleet server at {}", args.url))?;
    let status = response.status();
    let body = response
        .bytes()
        .await
        .with_context(|| format!("reading the answer of {}", args.url))?;
    if !status.is_success() {
        let reason = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
            .unwrap_or_default();
        let reason = Untrusted(&reason).capped(200).to_string();
        match status.as_u16() {
            401 if token.is_empty() => bail!(
                "{} answered 401 ({reason}): set CC_FLEET_TOKEN or CC_FLEET_TOKEN_FILE to a token with the {role} role",
                args.url
            ),
            403 => bail!(
                "{} answered 403 ({reason}): the token needs the {role} role",
                args.url
            ),
            code => bail!("{} answered {code}: {reason}", args.url),
        }
    }
    let answer: Value = serde_json::from_slice(&body)
        .with_context(|| format!("the answer of {} is not JSON", args.url))?;
    let text = if args.json {
        serde_json::to_string_pretty(&answer)? + "\n"
    } else {
        match args.command {
            RolloutCommand::Status => render_all(&answer),
            _ => render(&answer),
        }
    };
    super::write_stdout(text.as_bytes())
}

fn text(v: &Value) -> String {
    Untrusted(v.as_str().unwrap_or_default())
        .capped(200)
        .to_string()
}

/// One rollout in a few lines.
fn render(r: &Value) -> String {
    let c = &r["counts"];
    let mut out = format!(
        "{}  {}{}  {}  stage {} of {}\n  members {}  reporting {}  running {}  failed {}  without report {}\n",
        text(&r["name"]),
        text(&r["type"]),
        r["cluster"]
            .as_str()
            .map(|c| format!(" in {}", Untrusted(c).capped(64)))
            .unwrap_or_default(),
        text(&r["status"]),
        r["stage"].as_u64().unwrap_or(0) + 1,
        r["stages"].as_u64().unwrap_or(0),
        c["members"],
        c["reporting"],
        c["running"],
        c["failed"],
        c["unknown"],
    );
    if let Some(plugins) = r["plugins"].as_array() {
        for p in plugins {
            out.push_str(&format!("  plugin {} -> {}\n", text(&p[0]), text(&p[1])));
        }
    }
    let failing: Vec<String> = r["failing"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|f| {
            let why = text(&f["why"]);
            format!(
                "{} {}{}",
                f["members"],
                text(&f["health"]),
                if why.is_empty() {
                    String::new()
                } else {
                    format!(" ({why})")
                }
            )
        })
        .collect();
    if !failing.is_empty() {
        out.push_str(&format!("  failing: {}\n", failing.join(", ")));
    }
    if !text(&r["reason"]).is_empty() {
        out.push_str(&format!("  last decision: {}\n", text(&r["reason"])));
    }
    out
}

fn render_all(answer: &Value) -> String {
    let mut out = String::new();
    let rollouts = answer["rollouts"].as_array().cloned().unwrap_or_default();
    if rollouts.is_empty() {
        out.push_str("no rollouts (files in the configuration tree's rollouts/)\n");
    }
    for r in &rollouts {
        out.push_str(&render(r));
    }
    for refused in answer["refused"].as_array().into_iter().flatten() {
        out.push_str(&format!("refused: {}\n", text(refused)));
    }
    out
}

//! Plugins the fleet names by SHA-256: the config tree's `plugins` list, rolled out to
//! every agent that pulls it.
//!
//! ```json
//! {"plugins": [{"name": "loadavg",
//!               "sha256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
//!               "collect-interval": "10s",
//!               "config": {"cluster": "fritz"},
//!               "capabilities": {"read-files": ["/proc/loadavg"]}}]}
//! ```
//!
//! An entry is a plugin entry of the agent configuration with `sha256` in place of `path`
//! (a `path` from the fleet is refused: the fleet names content, not files of the node).
//! For every entry whose hash or settings changed the agent downloads the component from
//! `GET /api/fleet/plugins/{sha256}` (the fleet token, as every fleet call), checks its
//! SHA-256, keeps it in `fleet-plugin-dir` (mode 0700, written to a temporary file and
//! renamed, so a half-written file is never used), and starts the new version beside the
//! running one. Only once the new version runs (compiled, instantiated, `init` done) is the
//! old one stopped; a download that fails or does not match its hash, and a version that
//! does not start, leave the old version running, are logged with the reason and counted.
//! A failed download is tried again at the next configuration poll; a version that failed
//! to start is tried again only when its entry changes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use ccfleet::untrusted::Untrusted;
use reqwest::header::HeaderValue;
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::fleet_entry::{self, Checked};
use super::loops::{Assignment, AssignmentStage, Assignments};
use super::observe::ObservedPlugin;
use crate::plugin::ceiling::{Ceiling, Escalation};
use crate::plugin::signature::{self, PublicKeys};
use crate::plugin::sink::SinkHandle;
use crate::{FeedSenders, PluginHandle, PluginSpec, PluginState, Runtime};

/// The largest component the agent downloads.
pub const MAX_COMPONENT_BYTES: u64 = 256 << 20;
/// How long a new version may take to compile and start before it counts as failed.
const START_TIMEOUT: Duration = Duration::from_secs(120);

pub(crate) use super::observe::RolloutCounts;

/// A fleet plugin entry, checked.
#[derive(Debug, Clone, PartialEq)]
struct Wanted {
    name: String,
    sha256: String,
    /// The entry as a plugin specification, `path` pointing into the download directory.
    spec: PluginSpec,
}

/// A fleet plugin entry beyond the node's ceiling.
#[derive(Debug, Clone, PartialEq)]
struct Refused {
    name: String,
    sha256: String,
    escalation: Escalation,
}

/// Reads the `plugins` list of a fleet configuration; `dir` is where components are kept.
/// Entries beyond `ceiling` are returned apart, to be refused one by one; an entry that is
/// not a plugin entry at all fails the whole list.
fn wanted(
    config: &serde_json::Value,
    dir: &Path,
    ceiling: &Ceiling,
) -> Result<(Vec<Wanted>, Vec<Refused>), String> {
    let Some(list) = config.get("plugins") else {
        return Ok((Vec::new(), Vec::new()));
    };
    let Some(list) = list.as_array() else {
        return Err("plugins is not a list".to_owned());
    };
    let mut out = Vec::new();
    let mut refused = Vec::new();
    let mut names = BTreeSet::new();
    for (i, entry) in list.iter().enumerate() {
        let fail = |why: String| Err(format!("plugins[{i}]: {why}"));
        let checked = match fleet_entry::check(entry, dir, ceiling) {
            Ok(checked) => checked,
            Err(why) => return fail(why),
        };
        let name = match &checked {
            Checked::Admitted { name, .. } | Checked::Refused { name, .. } => name.clone(),
        };
        if !names.insert(name.clone()) {
            return fail(format!("two plugins are named {:?}", Untrusted(&name)));
        }
        match checked {
            Checked::Admitted { name, sha256, spec } if i < ceiling.max_plugins => {
                out.push(Wanted {
                    name,
                    sha256,
                    spec: *spec,
                });
            }
            Checked::Admitted { name, sha256, .. } => refused.push(Refused {
                name,
                sha256,
                escalation: Escalation {
                    grant: format!(
                        "plugins[{i}] (this node runs at most {} fleet plugins)",
                        ceiling.max_plugins
                    ),
                },
            }),
            Checked::Refused {
                name,
                sha256,
                escalation,
            } => refused.push(Refused {
                name,
                sha256,
                escalation,
            }),
        }
    }
    Ok((out, refused))
}

/// Why a component could not be fetched.
#[derive(Debug, thiserror::Error)]
enum FetchError {
    #[error("download failed: {0}")]
    Download(String),
    #[error("the download's SHA-256 is {got}, not the one asked for")]
    Mismatch { got: String },
    #[error("cannot keep the component: {0}")]
    Store(String),
    #[error("the download is not a WebAssembly component")]
    NotComponent,
    #[error("keeping the component would put more than {max} bytes in fleet-plugin-dir")]
    Quota { max: u64 },
}

impl FetchError {
    fn result(&self) -> &'static str {
        match self {
            FetchError::Download(_) => "download_failed",
            FetchError::Mismatch { .. } => "hash_mismatch",
            FetchError::Store(_) => "store_failed",
            FetchError::NotComponent => "not_a_component",
            FetchError::Quota { .. } => "quota_exceeded",
        }
    }
}

fn hex(digest: &[u8]) -> String {
    use std::fmt::Write;
    digest.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// The first bytes of every WebAssembly component (magic, version 0x0d, layer 1): a core
/// module, a shared library or anything else is never kept, so nothing of the fleet's lands
/// in the download directory that is not a component.
const COMPONENT_HEADER: [u8; 8] = [0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];

/// Whether `bytes` begin as a WebAssembly component does.
fn is_component(bytes: &[u8]) -> bool {
    bytes.starts_with(&COMPONENT_HEADER)
}

/// The bytes the files of `dir` hold, leaving out `except`.
fn stored_bytes(dir: &Path, except: &Path) -> std::io::Result<u64> {
    let mut total = 0u64;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.path() != except {
            total = total.saturating_add(entry.metadata()?.len());
        }
    }
    Ok(total)
}

/// Removes every file of `dir` that is not the component of a SHA-256 in `keep`.
fn prune(dir: &Path, keep: &BTreeSet<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let kept = name
            .to_str()
            .and_then(|n| n.strip_suffix(".wasm"))
            .is_some_and(|sha| keep.contains(sha));
        if !kept && entry.file_type().is_ok_and(|t| t.is_file()) {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => {
                    tracing::debug!(file = %entry.path().display(), "removed a component no configuration names")
                }
                Err(e) => {
                    tracing::warn!(file = %entry.path().display(), "cannot remove a component no configuration names: {e}")
                }
            }
        }
    }
}

/// Writes `bytes` to `target` in `dir` through a temporary file, so a half-written file is
/// never used.
fn keep(dir: &Path, target: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = tempfile::NamedTempFile::new_in(dir)?;
    file.write_all(bytes)?;
    file.as_file().sync_all()?;
    file.persist(target).map_err(|e| e.error)?;
    Ok(())
}

/// Creates the download directory, private to the agent's user.
fn private_dir(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
    }
    #[cfg(not(unix))]
    {
        std::fs::create_dir_all(dir)
    }
}

/// Downloads components from the fleet servers.
pub(crate) struct Fetcher {
    http: reqwest::Client,
    /// The fleet servers in order of preference (`fleet.url`, then its failover entries).
    bases: Vec<String>,
    token: Option<HeaderValue>,
    dir: PathBuf,
    /// The most bytes kept in `dir`.
    max_bytes: u64,
}

impl Fetcher {
    /// A fetcher for the fleet servers at `bases` (`http://host:port`, in order of
    /// preference), keeping at most `max_bytes` of components in `dir`.
    pub(crate) fn new(
        bases: &[String],
        token: &str,
        dir: PathBuf,
        max_bytes: u64,
    ) -> Result<Fetcher, String> {
        let token = if token.is_empty() {
            None
        } else {
            let mut value = HeaderValue::from_str(token)
                .map_err(|_| "the fleet token cannot be a header".to_owned())?;
            value.set_sensitive(true);
            Some(value)
        };
        // Trust anchors read at the first TLS handshake, not here.
        let http = ccfleet::tls::http_client_builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| format!("HTTP client: {e}"))?;
        Ok(Fetcher {
            http,
            bases: bases
                .iter()
                .map(|b| b.trim_end_matches('/').to_owned())
                .collect(),
            token,
            dir,
            max_bytes,
        })
    }

    /// The verified component file of `sha256`: the kept one when its content still has
    /// that hash, else a fresh download.
    async fn fetch(&self, sha256: &str) -> Result<PathBuf, FetchError> {
        let path = self.dir.join(format!("{sha256}.wasm"));
        if let Ok(bytes) = tokio::fs::read(&path).await {
            if hex(&Sha256::digest(&bytes)) == sha256 && is_component(&bytes) {
                return Ok(path);
            }
            tracing::warn!(
                file = %path.display(),
                "a kept component no longer matches its hash; downloading it again"
            );
            let _ = tokio::fs::remove_file(&path).await;
        }
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || private_dir(&dir))
            .await
            .map_err(|e| FetchError::Store(e.to_string()))?
            .map_err(|e| FetchError::Store(format!("{}: {e}", self.dir.display())))?;
        // The first server that delivers the right content wins; a mismatch is reported
        // over any other failure, since it is the one that points at tampering.
        let mut failure = None;
        let mut bytes = None;
        'servers: for base in &self.bases {
            // A second try on a transport failure: a kept-alive connection the server has
            // closed meanwhile (it drops idle ones) fails the first request sent on it, and
            // a healthy version must not count as failed for it.
            for attempt in 0..2 {
                match self.download(base, sha256).await {
                    Ok(got) => {
                        bytes = Some(got);
                        break 'servers;
                    }
                    Err(error) => {
                        let again = attempt == 0 && matches!(error, FetchError::Download(_));
                        if !matches!(failure, Some(FetchError::Mismatch { .. })) {
                            failure = Some(error);
                        }
                        if !again {
                            break;
                        }
                    }
                }
            }
        }
        let Some(bytes) = bytes else {
            return Err(failure
                .unwrap_or_else(|| FetchError::Download("no fleet server is configured".into())));
        };
        if !is_component(&bytes) {
            return Err(FetchError::NotComponent);
        }
        let dir = self.dir.clone();
        let target = path.clone();
        let max = self.max_bytes;
        tokio::task::spawn_blocking(move || -> Result<(), FetchError> {
            let used = stored_bytes(&dir, &target)
                .map_err(|e| FetchError::Store(format!("{}: {e}", dir.display())))?;
            if used.saturating_add(bytes.len() as u64) > max {
                return Err(FetchError::Quota { max });
            }
            keep(&dir, &target, &bytes)
                .map_err(|e| FetchError::Store(format!("{}: {e}", target.display())))
        })
        .await
        .map_err(|e| FetchError::Store(e.to_string()))??;
        Ok(path)
    }

    /// Removes the components no configuration names (a running plugin's included).
    async fn prune(&self, keep: BTreeSet<String>) {
        let dir = self.dir.clone();
        let _ = tokio::task::spawn_blocking(move || prune(&dir, &keep)).await;
    }

    /// The component of `sha256` from the server at `base`, checked against its hash.
    async fn download(&self, base: &str, sha256: &str) -> Result<Vec<u8>, FetchError> {
        let url = format!("{base}/api/fleet/plugins/{sha256}");
        let mut request = self.http.get(&url).timeout(Duration::from_secs(300));
        if let Some(token) = &self.token {
            request = request.header("X-Auth-Token", token.clone());
        }
        let server = shown_url(base);
        let response = request.send().await.map_err(|e| {
            FetchError::Download(if e.is_connect() {
                format!("cannot connect to the fleet server {server}")
            } else {
                format!("fleet server {server}: {}", e.without_url())
            })
        })?;
        let status = response.status();
        if !status.is_success() {
            return Err(FetchError::Download(format!(
                "the fleet server {server} answered {status}"
            )));
        }
        if response
            .content_length()
            .is_some_and(|n| n > MAX_COMPONENT_BYTES)
        {
            return Err(FetchError::Download(format!(
                "the component is larger than {MAX_COMPONENT_BYTES} bytes"
            )));
        }
        let mut response = response;
        let mut bytes = Vec::new();
        let mut hasher = Sha256::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| FetchError::Download(e.without_url().to_string()))?
        {
            if (bytes.len() + chunk.len()) as u64 > MAX_COMPONENT_BYTES {
                return Err(FetchError::Download(format!(
                    "the component is larger than {MAX_COMPONENT_BYTES} bytes"
                )));
            }
            hasher.update(&chunk);
            bytes.extend_from_slice(&chunk);
        }
        let got = hex(&hasher.finalize());
        if got != sha256 {
            return Err(FetchError::Mismatch { got });
        }
        Ok(bytes)
    }
}

/// A fleet server's URL as logs and health reports show it: without user information.
fn shown_url(base: &str) -> String {
    match reqwest::Url::parse(base) {
        Ok(mut url) => {
            let _ = url.set_username("");
            let _ = url.set_password(None);
            url.as_str().trim_end_matches('/').to_owned()
        }
        Err(_) => "<an invalid URL>".to_owned(),
    }
}

/// A fleet plugin that runs.
struct Running {
    wanted: Wanted,
    handle: PluginHandle,
}

/// The rollout task's state.
pub(crate) struct Rollout {
    pub runtime: Runtime,
    pub feeds: Arc<FeedSenders>,
    pub sink: SinkHandle,
    pub fetcher: Fetcher,
    /// Names of the agent's own plugins, which the fleet cannot replace.
    pub local: BTreeSet<String>,
    /// What `/metrics` shows: the agent's own plugins first, then the fleet's.
    pub observed: Arc<RwLock<Vec<ObservedPlugin>>>,
    pub counts: Arc<RolloutCounts>,
    /// What `/readyz` shows: each plugin the fleet names and why it does not run.
    pub assignments: Arc<Assignments>,
    pub retry_interval: Duration,
    /// What the fleet may grant its plugins on this node.
    pub ceiling: Ceiling,
    /// The keys a fleet plugin's component must be signed with; none: not checked.
    pub signing: PublicKeys,
}

impl Rollout {
    fn count(&self, name: &str, result: &'static str) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        *counts.entry((name.to_owned(), result)).or_default() += 1;
    }

    /// Records where the version of `name` the fleet names is, and why it does not run.
    fn assign(&self, name: &str, sha256: &str, stage: AssignmentStage, problem: Option<String>) {
        self.record(name, sha256, stage, problem, None);
    }

    fn record(
        &self,
        name: &str,
        sha256: &str,
        stage: AssignmentStage,
        problem: Option<String>,
        refusal: Option<String>,
    ) {
        self.assignments
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                name.to_owned(),
                Assignment {
                    sha256: sha256.to_owned(),
                    stage,
                    problem,
                    refusal,
                },
            );
    }

    /// Records that the version of `name` is being downloaded and started. A version whose
    /// download failed stays failed while it is tried again: it flips to starting only on
    /// its way to running, never back and forth with every retry.
    fn assign_pending(&self, name: &str, sha256: &str) {
        let mut assignments = self.assignments.lock().unwrap_or_else(|e| e.into_inner());
        if assignments
            .get(name)
            .is_some_and(|a| a.sha256 == sha256 && a.stage == AssignmentStage::DownloadFailed)
        {
            return;
        }
        assignments.insert(
            name.to_owned(),
            Assignment {
                sha256: sha256.to_owned(),
                stage: AssignmentStage::Pending,
                problem: Some("being downloaded and started".to_owned()),
                refusal: None,
            },
        );
    }

    fn publish(&self, running: &BTreeMap<String, Running>) {
        let mut observed = self.observed.write().unwrap_or_else(|e| e.into_inner());
        observed.retain(|p| self.local.contains(&*p.name));
        observed.extend(running.values().map(|r| ObservedPlugin {
            name: r.handle.name().into(),
            status: r.handle.status(),
            stats: r.handle.stats(),
        }));
    }

    /// Runs until `stop` turns true, applying `first` and then every configuration update;
    /// failed downloads are retried every `retry_interval`.
    pub(crate) fn spawn(
        self,
        first: Option<String>,
        mut configs: ccfleet::client::Latest<ccfleet::client::Update>,
        mut stop: watch::Receiver<bool>,
        alive: super::loops::LoopToken,
    ) -> JoinHandle<()> {
        tokio::spawn(async move {
            let _alive = alive;
            let mut running: BTreeMap<String, Running> = BTreeMap::new();
            let mut failed: BTreeMap<String, Wanted> = BTreeMap::new();
            let mut refused: BTreeMap<String, Refused> = BTreeMap::new();
            let mut current = first;
            let mut open = true;
            loop {
                // A stop ends a rollout midway: the half-started version is dropped (and so
                // stopped) with the future.
                let retry = tokio::select! {
                    biased;
                    _ = stop.changed() => break,
                    retry = self.apply(&current, &mut running, &mut failed, &mut refused) => retry,
                };
                // Only a failed download needs the timer: otherwise nothing changes until the
                // next configuration, and an idle agent does not wake for it.
                tokio::select! {
                    biased;
                    _ = stop.changed() => break,
                    update = configs.recv(), if open => match update {
                        Some(update) => current = update.config,
                        None => open = false,
                    },
                    () = tokio::time::sleep(self.retry_interval), if retry => {}
                }
            }
            for (_, plugin) in std::mem::take(&mut running) {
                plugin.handle.stop().await;
            }
        })
    }

    /// Brings the running fleet plugins to what `config` names. Returns whether a download
    /// failed, so the rollout must be tried again after `retry_interval`.
    async fn apply(
        &self,
        config: &Option<String>,
        running: &mut BTreeMap<String, Running>,
        failed: &mut BTreeMap<String, Wanted>,
        refused: &mut BTreeMap<String, Refused>,
    ) -> bool {
        let dir = &self.fetcher.dir;
        let config = match config
            .as_deref()
            .map(serde_json::from_str::<serde_json::Value>)
        {
            None => serde_json::Value::Null,
            Some(Ok(config)) => config,
            Some(Err(_)) => {
                tracing::warn!(
                    "the fleet configuration is not JSON; keeping the running fleet plugins"
                );
                return false;
            }
        };
        let (wanted, beyond) = match wanted(&config, dir, &self.ceiling) {
            Ok(wanted) => wanted,
            Err(why) => {
                tracing::warn!(
                    "the fleet configuration's plugins are invalid; keeping the running ones: {}",
                    Untrusted(&why).capped(500)
                );
                return false;
            }
        };
        // A refused entry's name stays named: a version of it that ran within the ceiling
        // keeps running, as after any failed rollout.
        let names: BTreeSet<String> = wanted
            .iter()
            .map(|w| w.name.clone())
            .chain(beyond.iter().map(|r| r.name.clone()))
            .collect();
        let gone: Vec<String> = running
            .keys()
            .filter(|n| !names.contains(*n))
            .cloned()
            .collect();
        for name in gone {
            if let Some(plugin) = running.remove(&name) {
                tracing::info!(plugin = %Untrusted(&name), "the fleet no longer names this plugin; stopping it");
                plugin.handle.stop().await;
            }
            self.publish(running);
        }
        failed.retain(|name, _| names.contains(name));
        refused.retain(|name, _| beyond.iter().any(|r| &r.name == name));
        for entry in beyond {
            if self.local.contains(&entry.name) {
                continue;
            }
            let shown = Untrusted(&entry.name).capped(100).to_string();
            let why = format!(
                "refused: {}",
                Untrusted(&entry.escalation.to_string()).capped(300)
            );
            // Logged and counted once per entry, not at every configuration poll.
            if refused.get(&entry.name) != Some(&entry) {
                tracing::warn!(plugin = %shown, sha256 = %entry.sha256, "the fleet plugin is not run: {why}");
                self.count(&entry.name, "beyond_ceiling");
                failed.remove(&entry.name);
            }
            self.record(
                &entry.name,
                &entry.sha256,
                AssignmentStage::StartFailed,
                Some(why),
                Some(entry.escalation.reason()),
            );
            refused.insert(entry.name.clone(), entry);
        }
        // What no configuration names goes first, so it does not count against the quota.
        let named: BTreeSet<String> = wanted.iter().map(|w| w.sha256.clone()).collect();
        let keep = |running: &BTreeMap<String, Running>| -> BTreeSet<String> {
            named
                .iter()
                .cloned()
                .chain(running.values().map(|r| r.wanted.sha256.clone()))
                .collect()
        };
        self.fetcher.prune(keep(running)).await;
        self.assignments
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|name, _| names.contains(name) && !self.local.contains(name));
        let mut retry = false;
        for want in wanted {
            let name = want.name.clone();
            let shown = Untrusted(&name).capped(100).to_string();
            if self.local.contains(&name) {
                if failed.insert(name.clone(), want.clone()).as_ref() != Some(&want) {
                    tracing::warn!(plugin = %shown, "the fleet names a plugin the agent configures itself; the agent's own entry wins");
                }
                continue;
            }
            refused.remove(&name);
            if running.get(&name).is_some_and(|r| r.wanted == want) {
                self.assign(&name, &want.sha256, AssignmentStage::Running, None);
                continue;
            }
            if failed.get(&name) == Some(&want) {
                continue;
            }
            self.assign_pending(&name, &want.sha256);
            let previous = running.get(&name).map(|r| r.wanted.sha256.clone());
            let keeping = previous
                .as_deref()
                .map_or_else(|| "nothing runs".to_owned(), |s| format!("keeping {s}"));
            if let Err(error) = self.fetcher.fetch(&want.sha256).await {
                tracing::warn!(plugin = %shown, sha256 = %want.sha256, "cannot roll out the plugin ({keeping}): {error}");
                self.assign(
                    &name,
                    &want.sha256,
                    AssignmentStage::DownloadFailed,
                    Some(format!("{error} ({keeping})")),
                );
                self.count(&name, error.result());
                retry = true;
                continue;
            }
            if let Err(refusal) = self.signed(&want).await {
                // Not retried until the entry changes: the same bytes never verify later.
                let why = format!(
                    "refused: {refusal}{}",
                    if refusal == signature::Refusal::Unsigned {
                        "; this node runs only fleet plugins signed by one of its plugin-public-keys"
                    } else {
                        ""
                    }
                );
                tracing::warn!(plugin = %shown, sha256 = %want.sha256, "the fleet plugin is not run ({keeping}): {why}");
                self.record(
                    &name,
                    &want.sha256,
                    AssignmentStage::StartFailed,
                    Some(why),
                    Some(refusal.result().to_owned()),
                );
                self.count(&name, refusal.result());
                failed.insert(name, want);
                continue;
            }
            match self.start(&want).await {
                Ok(handle) => {
                    tracing::info!(plugin = %shown, sha256 = %want.sha256, previous = previous.as_deref().unwrap_or("none"), "fleet plugin version running");
                    self.assign(&name, &want.sha256, AssignmentStage::Running, None);
                    let old = running.insert(
                        name.clone(),
                        Running {
                            wanted: want,
                            handle,
                        },
                    );
                    failed.remove(&name);
                    self.publish(running);
                    if let Some(old) = old {
                        old.handle.stop().await;
                    }
                    self.count(&name, "swapped");
                }
                Err(why) => {
                    tracing::warn!(plugin = %shown, sha256 = %want.sha256, "the new plugin version does not start ({keeping}): {why}");
                    self.assign(
                        &name,
                        &want.sha256,
                        AssignmentStage::StartFailed,
                        Some(format!("it does not start ({keeping}): {why}")),
                    );
                    self.count(&name, "instantiate_failed");
                    failed.insert(name, want);
                }
            }
        }
        self.fetcher.prune(keep(running)).await;
        retry
    }

    /// Checks the signature of `want`'s kept component against the node's keys (none: not
    /// checked). Run before every start, so a cached configuration is held to the keys the
    /// agent has now.
    async fn signed(&self, want: &Wanted) -> Result<(), signature::Refusal> {
        if self.signing.is_empty() {
            return Ok(());
        }
        let path = want.spec.path.clone();
        let keys = self.signing.clone();
        tokio::task::spawn_blocking(move || match std::fs::read(&path) {
            Ok(bytes) => signature::verify(&bytes, &keys),
            Err(e) => Err(signature::Refusal::Malformed(format!(
                "cannot read the kept component: {e}"
            ))),
        })
        .await
        .unwrap_or_else(|e| Err(signature::Refusal::Malformed(e.to_string())))
    }

    /// Starts `want` and waits until it runs; on failure it is stopped again.
    async fn start(&self, want: &Wanted) -> Result<PluginHandle, String> {
        // Compiling and linking first gives the reason a component cannot be used; the
        // supervisor's own load then comes from the compile cache.
        self.runtime
            .load(&want.spec)
            .await
            .map_err(|e| e.to_string())?;
        let handle =
            self.runtime
                .spawn(want.spec.clone(), self.feeds.subscribe(), self.sink.clone());
        let mut status = handle.status();
        let outcome = tokio::time::timeout(
            START_TIMEOUT,
            status.wait_for(|s| s.state != PluginState::Starting || s.generation > 1),
        )
        .await
        .map(|waited| waited.map(|status| status.clone()));
        let result = match outcome {
            Ok(Ok(status)) if status.state == PluginState::Running => Ok(()),
            Ok(Ok(status)) => Err(match &status.last_failure {
                Some(failure) => failure.to_string(),
                None => format!("it went to {:?}", status.state),
            }),
            Ok(Err(_)) => Err("its supervisor ended".to_owned()),
            Err(_) => Err(format!(
                "it did not start within {}",
                ccfleet::duration::format(START_TIMEOUT)
            )),
        };
        match result {
            Ok(()) => Ok(handle),
            Err(why) => {
                handle.stop().await;
                Err(why)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn a_fleet_entry_becomes_a_spec_in_the_download_directory() {
        let config = serde_json::json!({"plugins": [{"name": "load", "sha256": SHA,
            "collect-interval": "10s", "config": {"a": 1},
            "capabilities": {"read-files": ["/proc/loadavg"]}}]});
        let (wanted, refused) =
            wanted(&config, Path::new("/var/cache/fleet"), &Ceiling::default()).unwrap();
        assert!(refused.is_empty());
        assert_eq!(wanted.len(), 1);
        assert_eq!(
            wanted[0].spec.path,
            Path::new(&format!("/var/cache/fleet/{SHA}.wasm"))
        );
        assert_eq!(wanted[0].spec.display_name(), "load");
        assert_eq!(
            wanted[0].spec.collect_interval,
            Some(Duration::from_secs(10))
        );
    }

    #[test]
    fn a_path_an_uppercase_hash_or_a_missing_name_is_refused() {
        let dir = Path::new("/d");
        for (entry, why) in [
            (
                serde_json::json!({"name": "x", "sha256": SHA, "path": "/etc/shadow"}),
                "not by path",
            ),
            (
                serde_json::json!({"name": "x", "sha256": SHA.to_uppercase()}),
                "lowercase",
            ),
            (serde_json::json!({"sha256": SHA}), "name is missing"),
            (
                serde_json::json!({"name": "x", "sha256": SHA, "colour": 1}),
                "unknown field",
            ),
        ] {
            let err = wanted(
                &serde_json::json!({ "plugins": [entry] }),
                dir,
                &Ceiling::default(),
            )
            .unwrap_err();
            assert!(err.contains(why), "{err}");
        }
    }

    #[test]
    fn entries_beyond_the_ceiling_or_its_plugin_count_are_refused_one_by_one() {
        let ceiling = Ceiling {
            max_plugins: 2,
            ..Ceiling::default()
        };
        let config = serde_json::json!({"plugins": [
            {"name": "a", "sha256": SHA},
            {"name": "b", "sha256": SHA, "capabilities": {"run": ["pwn"]}},
            {"name": "c", "sha256": SHA},
        ]});
        let (wanted, refused) = wanted(&config, Path::new("/d"), &ceiling).unwrap();
        assert_eq!(wanted.len(), 1);
        assert_eq!(wanted[0].name, "a");
        assert_eq!(refused.len(), 2);
        assert!(refused[0].escalation.grant.contains("run.pwn"));
        assert!(
            refused[1]
                .escalation
                .grant
                .contains("at most 2 fleet plugins")
        );
    }

    #[test]
    fn only_components_are_kept_and_the_directory_is_pruned() {
        assert!(is_component(&COMPONENT_HEADER));
        assert!(!is_component(b"\x7fELF\x02\x01\x01\x00"));
        assert!(!is_component(&[
            0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00
        ]));
        let dir = tempfile::tempdir().unwrap();
        for name in [
            format!("{SHA}.wasm"),
            "old.wasm".to_owned(),
            "x.so".to_owned(),
        ] {
            std::fs::write(dir.path().join(name), b"1234").unwrap();
        }
        assert_eq!(stored_bytes(dir.path(), Path::new("/none")).unwrap(), 12);
        prune(dir.path(), &BTreeSet::from([SHA.to_owned()]));
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, [std::ffi::OsString::from(format!("{SHA}.wasm"))]);
    }
}

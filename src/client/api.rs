//! The low-level operations: register, pull the configuration, heartbeat, deregister.
//!
//! They are public for applications that drive their own loop; [`Client::run`] drives them
//! otherwise.

use std::time::Duration;

use reqwest::header::{ETAG, HeaderValue, IF_NONE_MATCH};
use reqwest::{Method, StatusCode};

use super::error::{Error, Op};
use super::http::{DRAIN_LIMIT, drain, read_limited, status_error};
use super::{Client, Inner, Source, Update};
use crate::wire::{self, RegisterRequest, RegisterResponse};

/// Largest configuration body accepted.
pub const MAX_CONFIG_SIZE: usize = 16 << 20;

/// Upper bound for handing a heartbeat to the NATS client; a connected client takes it at
/// once, so waiting longer would only delay the REST fallback.
const NATS_PUBLISH_TIMEOUT: Duration = Duration::from_secs(1);

impl Client {
    /// Registers with cc-backend and keeps the instance id it assigns. A registration of the
    /// same cluster, host and type elsewhere rotates the id; the old one becomes unknown.
    pub async fn register(&self) -> Result<RegisterResponse, Error> {
        self.inner.register().await
    }

    /// Pulls the configuration, sending the known ETag. Returns the current configuration and
    /// whether its body differs from the previous one (ETags are not compared: a cosmetic edit
    /// on the server or a response without an ETag is no change).
    pub async fn pull_config(&self) -> Result<(Update, bool), Error> {
        self.inner.pull_config().await
    }

    /// Sends one heartbeat: over NATS while the NATS client is connected and a heartbeat
    /// subject is configured, over REST otherwise. Only REST can detect an unknown instance.
    pub async fn heartbeat(&self) -> Result<(), Error> {
        self.inner.heartbeat().await
    }

    /// Deregisters and forgets the instance id. Without an id, and when cc-backend no longer
    /// knows it, this succeeds.
    pub async fn deregister(&self) -> Result<(), Error> {
        self.inner.deregister().await
    }
}

impl Inner {
    fn instance_id(&self) -> Option<String> {
        self.state().instance_id.clone()
    }

    /// Forgets `id` unless a concurrent registration has already replaced it.
    fn forget(&self, id: &str) {
        let mut state = self.state();
        if state.instance_id.as_deref() == Some(id) {
            state.instance_id = None;
        }
    }

    pub(super) async fn register(&self) -> Result<RegisterResponse, Error> {
        let identity = &self.identity;
        let body = RegisterRequest {
            cluster: identity.cluster.clone(),
            hostname: identity.hostname.clone(),
            service_type: identity.service_type,
            meta_data: self.meta.clone(),
        };
        let path = format!("/api/fleet/register/{}/", identity.scope.as_str());
        let response = self
            .http
            .send(Op::Register, Method::POST, &path, |r| r.json(&body))
            .await?;
        if response.status() != StatusCode::CREATED {
            return Err(status_error(Op::Register, response).await);
        }
        let invalid = |reason: String| Error::InvalidResponse {
            op: Op::Register,
            reason,
        };
        let body = read_limited(Op::Register, response, DRAIN_LIMIT)
            .await?
            .ok_or_else(|| invalid(format!("response exceeds {DRAIN_LIMIT} bytes")))?;
        // serde's message could quote the id; position and category are enough.
        let registration: RegisterResponse = serde_json::from_slice(&body).map_err(|e| {
            invalid(format!(
                "response is not a registration ({:?} error at line {}, column {})",
                e.classify(),
                e.line(),
                e.column()
            ))
        })?;
        if registration.instance_id.is_empty() {
            return Err(invalid("response without instance id".into()));
        }
        // The id goes into request paths: refuse anything that could change their meaning.
        if !registration
            .instance_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(invalid("response holds a malformed instance id".into()));
        }
        {
            let mut state = self.state();
            state.instance_id = Some(registration.instance_id.clone());
            state.registered_at = Some(tokio::time::Instant::now());
        }
        tracing::info!(
            service_type = %identity.service_type,
            scope = identity.scope.as_str(),
            cluster = %identity.cluster,
            hostname = %identity.hostname,
            // As a string, as every revision in the logs: a JSON number above 2^53 loses digits
            // in most readers (jq).
            config_revision = %registration.config_revision,
            server = %self.http.current_shown(),
            "fleet: registered with cc-backend"
        );
        Ok(registration)
    }

    pub(super) async fn pull_config(&self) -> Result<(Update, bool), Error> {
        let (id, etag, report) = {
            let state = self.state();
            let id = state.instance_id.clone().ok_or(Error::NotRegistered)?;
            (id, state.etag.clone(), state.report.clone())
        };
        // Sent verbatim, quotes included; an ETag that cannot be a header is not sent at all.
        // The same ETag goes to whichever server answers: one sharing the registry and the
        // configuration tree answers 304.
        let if_none_match = (!etag.is_empty())
            .then(|| HeaderValue::from_str(&etag).ok())
            .flatten();
        let response = self
            .http
            .send(
                Op::Config,
                Method::GET,
                &format!("/api/fleet/config/{id}"),
                |r| {
                    let r = match &if_none_match {
                        Some(value) => r.header(IF_NONE_MATCH, value.clone()),
                        None => r,
                    };
                    match &report {
                        Some(value) => r.header(wire::HEADER_AGENT_REPORT, value.clone()),
                        None => r,
                    }
                },
            )
            .await?;
        match response.status() {
            StatusCode::OK => self.accept_config(response).await,
            StatusCode::NOT_MODIFIED => {
                drain(response).await;
                let state = self.state();
                let update = Update {
                    config: state.blob.clone(),
                    revision: state.revision.clone(),
                    source: Source::Fleet,
                };
                Ok((update, false))
            }
            StatusCode::NO_CONTENT => {
                drain(response).await;
                let changed = {
                    let mut state = self.state();
                    state.etag.clear();
                    state.revision.clear();
                    state.blob.take().is_some()
                };
                if changed {
                    self.remove_cache().await;
                }
                Ok((Update::none(), changed))
            }
            _ => {
                let err = status_error(Op::Config, response).await;
                if err.is_unknown_instance() {
                    self.forget(&id);
                }
                Err(err)
            }
        }
    }

    async fn accept_config(&self, response: reqwest::Response) -> Result<(Update, bool), Error> {
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        let etag = header(ETAG.as_str());
        let revision = match header(wire::HEADER_CONFIG_REVISION) {
            r if r.is_empty() => revision_from_etag(&etag).to_owned(),
            r => r,
        };
        let invalid = |reason: String| Error::InvalidResponse {
            op: Op::Config,
            reason,
        };
        let body = read_limited(Op::Config, response, MAX_CONFIG_SIZE)
            .await?
            .ok_or_else(|| invalid(format!("body exceeds {MAX_CONFIG_SIZE} bytes")))?;
        let not_json = || invalid("body is not valid JSON".into());
        serde_json::from_slice::<serde::de::IgnoredAny>(&body).map_err(|_| not_json())?;
        let body = String::from_utf8(body).map_err(|_| not_json())?;
        let changed = {
            let mut state = self.state();
            let changed = state.blob.as_deref() != Some(body.as_str());
            state.etag.clone_from(&etag);
            state.revision.clone_from(&revision);
            state.blob = Some(body.clone());
            changed
        };
        if changed {
            self.store_cache(etag, revision.clone(), body.clone()).await;
        }
        let update = Update {
            config: Some(body),
            revision,
            source: Source::Fleet,
        };
        Ok((update, changed))
    }

    pub(super) async fn heartbeat(&self) -> Result<(), Error> {
        let id = self.instance_id().ok_or(Error::NotRegistered)?;
        if !self.heartbeat_subject.is_empty()
            && let Some(nats) = self.connected_nats()
        {
            match self.publish_heartbeat(&nats, &id).await {
                Ok(()) => return Ok(()),
                Err(reason) => {
                    tracing::debug!(%reason, "fleet: NATS heartbeat failed, sending it over REST");
                }
            }
        }
        let response = self
            .http
            .send(
                Op::Heartbeat,
                Method::POST,
                &format!("/api/fleet/heartbeat/{id}"),
                |r| r,
            )
            .await?;
        match response.status() {
            StatusCode::OK | StatusCode::NO_CONTENT => {
                drain(response).await;
                Ok(())
            }
            _ => {
                let err = status_error(Op::Heartbeat, response).await;
                if err.is_unknown_instance() {
                    self.forget(&id);
                }
                Err(err)
            }
        }
    }

    /// The application's NATS client if it is connected right now. A client that is not
    /// connected would queue the message and send it, stale, after reconnecting.
    pub(super) fn connected_nats(&self) -> Option<async_nats::Client> {
        let client = self.nats.as_ref().and_then(|provider| provider())?;
        (client.connection_state() == async_nats::connection::State::Connected).then_some(client)
    }

    async fn publish_heartbeat(&self, nats: &async_nats::Client, id: &str) -> Result<(), String> {
        let payload = wire::encode_heartbeat(wire::now_ns(), &[id]).map_err(|e| e.to_string())?;
        let subject = self.heartbeat_subject.clone();
        match tokio::time::timeout(NATS_PUBLISH_TIMEOUT, nats.publish(subject, payload.into()))
            .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(crate::nats::scrub(&e, &[])),
            Err(_) => Err("publishing timed out".into()),
        }
    }

    pub(super) async fn deregister(&self) -> Result<(), Error> {
        let Some(id) = self.instance_id() else {
            return Ok(());
        };
        let response = self
            .http
            .send(
                Op::Deregister,
                Method::DELETE,
                &format!("/api/fleet/deregister/{id}"),
                |r| r,
            )
            .await?;
        match response.status() {
            StatusCode::OK | StatusCode::NO_CONTENT | StatusCode::NOT_FOUND => {
                drain(response).await;
                self.forget(&id);
                tracing::info!("fleet: deregistered from cc-backend");
                Ok(())
            }
            _ => Err(status_error(Op::Deregister, response).await),
        }
    }

    async fn store_cache(&self, etag: String, revision: String, body: String) {
        let Some(cache) = self.cache.clone() else {
            return;
        };
        let path = cache.path().to_owned();
        let result =
            tokio::task::spawn_blocking(move || cache.store(&etag, &revision, &body)).await;
        match result {
            Ok(Ok(())) => tracing::debug!(path = %path.display(), "fleet: config cache written"),
            Ok(Err(e)) => {
                tracing::warn!(path = %path.display(), error = %e, "fleet: cannot write the config cache");
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "fleet: cannot write the config cache");
            }
        }
    }

    async fn remove_cache(&self) {
        let Some(cache) = self.cache.clone() else {
            return;
        };
        let path = cache.path().to_owned();
        match tokio::task::spawn_blocking(move || cache.remove()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(path = %path.display(), error = %e, "fleet: cannot remove the config cache");
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "fleet: cannot remove the config cache");
            }
        }
    }

    /// Loads the cache (blocking file I/O off the runtime threads).
    pub(super) async fn load_cache(&self) -> Option<super::cache::Entry> {
        let cache = self.cache.clone()?;
        tokio::task::spawn_blocking(move || cache.load())
            .await
            .ok()
            .flatten()
    }
}

/// The revision an ETag stands for: `W/"12"` and `"12"` both give `12`.
fn revision_from_etag(etag: &str) -> &str {
    let etag = etag.strip_prefix("W/").unwrap_or(etag);
    etag.trim_matches('"')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revisions_from_etags() {
        assert_eq!(revision_from_etag("\"12\""), "12");
        assert_eq!(revision_from_etag("W/\"12\""), "12");
        assert_eq!(revision_from_etag("12"), "12");
        assert_eq!(revision_from_etag(""), "");
    }
}

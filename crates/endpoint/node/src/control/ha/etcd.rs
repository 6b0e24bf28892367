//! The lease in etcd (v3 API, 3.4 or newer) through etcd's JSON gateway:
//! HTTP/1.1 POSTs to `[CLIENT-URL]/v3/...`, which etcd serves on its client
//! port next to gRPC (etcd.io, "dev-guide/api_grpc_gateway": 3.4 serves
//! `/v3/` and still `/v3beta/`, 3.5 and later `/v3/` only, so `/v3/` is the
//! one prefix for every version we support). Keys and values are base64 in
//! the JSON, 64-bit integers are strings, zero values are omitted.
//!
//! A lease grant, then a transaction that puts the key bound to that lease
//! only if the key does not exist (its create revision is 0), one keepalive
//! request per renewal while we hold it, a watch on the key from the
//! revision we last read while we wait. The key disappears when the lease
//! expires or is revoked, which is what lets the standby in.
//!
//! Why the gateway and not gRPC: etcd's gRPC client crate generates its code
//! at build time with `protoc`, an install step the README's start cannot
//! ask for; the gateway needs a plain HTTP client (ureq, blocking, TLS
//! through native-tls, which is the OpenSSL the rest of the node links).
//!
//! TLS: `https://` endpoints (or any endpoint when `etcd_ca_file` is set),
//! trusting `etcd_ca_file` (else the system's roots), with an optional
//! client certificate (`etcd_cert_file`, `etcd_key_file`). Auth: `etcd_user`
//! with the password in `etcd_password_file`; the token etcd gives for them
//! goes in each request's `Authorization` header, and is fetched again when
//! etcd says it is no longer valid.
//!
//! Every call is bounded by `op_timeout_ms` (a wait by its own `max`).

use super::{HaConfig, LeaseStore};
use anyhow::{anyhow, ensure, Context};
use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use serde_json::{json, Value};
use std::io::BufRead;
use std::path::Path;
use std::time::Duration;
use ureq::tls::{Certificate, ClientCert, PemItem, PrivateKey, RootCerts, TlsConfig, TlsProvider};
use zeroize::Zeroizing;

/// The most bytes of one answer (ours hold one key of at most
/// `MAX_NAME_LEN` bytes): bounds what a broken or hostile endpoint can
/// make the lease thread buffer.
pub const MAX_RESPONSE_BYTES: u64 = 1 << 20;
/// The most bytes of a password, CA, certificate or key file.
pub const MAX_SECRET_FILE_BYTES: u64 = 1 << 20;
/// gRPC status "unauthenticated": the auth token expired or is unknown.
const GRPC_UNAUTHENTICATED: i64 = 16;
/// gRPC status "not found" (revoking a lease that is already gone).
const GRPC_NOT_FOUND: i64 = 5;

/// etcd refused a request (it answered, with an error).
#[derive(Debug)]
struct Refused {
    code: i64,
    message: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "etcd refused: {} (gRPC code {})",
            self.message, self.code
        )
    }
}

impl std::error::Error for Refused {}

pub struct EtcdStore {
    agent: ureq::Agent,
    /// Base URLs ("http://127.0.0.1:2379"); calls go to `endpoints[next]`,
    /// and the next one after a failure to reach it.
    endpoints: Vec<String>,
    next: usize,
    /// `etcd_user` and the password read from `etcd_password_file`.
    auth: Option<(String, Zeroizing<String>)>,
    token: Option<Zeroizing<String>>,
    /// The key, base64.
    key: String,
    node: String,
    ttl_s: i64,
    timeout: Duration,
    /// The lease we hold the key with.
    lease: Option<i64>,
    /// The store revision of the last read of the key (range or txn): a
    /// watch starts just after it, so no change between two waits is missed.
    rev: Option<i64>,
}

impl EtcdStore {
    pub fn connect(cfg: &HaConfig) -> anyhow::Result<EtcdStore> {
        let tls = cfg.etcd_ca_file.is_some() || cfg.etcd_cert_file.is_some();
        let endpoints = cfg.endpoints.iter().map(|e| base_url(e, tls)).collect();
        let auth = match (&cfg.etcd_user, &cfg.etcd_password_file) {
            (Some(u), Some(p)) => Some((u.clone(), read_password(p)?)),
            _ => None,
        };
        let timeout = cfg.op_timeout();
        let agent = ureq::Agent::config_builder()
            .tls_config(tls_config(cfg)?)
            // Error answers carry etcd's message in the body: read it.
            .http_status_as_error(false)
            .timeout_global(Some(timeout))
            .build()
            .into();
        let mut s = EtcdStore {
            agent,
            endpoints,
            next: 0,
            auth,
            token: None,
            key: B64.encode(&cfg.key),
            node: cfg.node.clone(),
            // Whole seconds (validate() asks for a multiple of 1000 ms).
            ttl_s: (cfg.lease_ttl_ms / 1000).max(1) as i64,
            timeout,
            lease: None,
            rev: None,
        };
        s.first_contact().with_context(|| {
            format!(
                "[ha] etcd at {}: cannot use it: is etcd running there, and do the [ha] etcd_* options match its TLS and auth?",
                cfg.endpoints.join(",")
            )
        })?;
        Ok(s)
    }

    /// One read of the key on each endpoint in turn until one answers: an
    /// unreachable store, a TLS mismatch or refused credentials stop the
    /// start with etcd's own words rather than a node that never serves.
    fn first_contact(&mut self) -> anyhow::Result<()> {
        let mut last = None;
        for _ in 0..self.endpoints.len() {
            match self.holder() {
                Ok(_) => return Ok(()),
                Err(e) if e.downcast_ref::<Refused>().is_some() => {
                    let anonymous =
                        self.auth.is_none() && e.to_string().contains("user name is empty");
                    return Err(if anonymous {
                        e.context(
                            "etcd has auth enabled: set [ha] etcd_user and etcd_password_file",
                        )
                    } else {
                        e
                    });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| anyhow!("no endpoints")))
    }

    /// POSTs `body` to `path` on the current endpoint within `t`. A
    /// failure to reach it moves to the next endpoint for the next call.
    fn send(
        &mut self,
        path: &str,
        body: &str,
        t: Duration,
    ) -> anyhow::Result<ureq::http::Response<ureq::Body>> {
        let url = format!("{}{path}", self.endpoints[self.next]);
        let mut req = self
            .agent
            .post(&url)
            .config()
            .timeout_global(Some(t))
            .build()
            .header("Content-Type", "application/json");
        if let Some(tok) = &self.token {
            req = req.header("Authorization", tok.as_str());
        }
        req.send(body).map_err(|e| {
            self.next = (self.next + 1) % self.endpoints.len();
            anyhow!("{url}: {e}")
        })
    }

    /// One unary call (or one message of a stream call): the answer, or
    /// etcd's refusal as [`Refused`].
    fn call_once(&mut self, path: &str, body: &str) -> anyhow::Result<Value> {
        let r = self.send(path, body, self.timeout)?;
        let ok = r.status().is_success();
        let text = r
            .into_body()
            .with_config()
            .limit(MAX_RESPONSE_BYTES)
            .read_to_string()
            .map_err(|e| anyhow!("{path}: reading the answer: {e}"))?;
        let v: Value = serde_json::from_str(text.lines().next().unwrap_or(""))
            .map_err(|e| anyhow!("{path}: not JSON ({e}): {:.200}", text))?;
        refusal(&v, ok)?;
        // Stream calls wrap each message in "result".
        Ok(match v.get("result") {
            Some(r) => r.clone(),
            None => v,
        })
    }

    /// A call with the auth token: fetched first if we have none, and
    /// fetched again (once) when etcd says it is no longer valid.
    fn call(&mut self, path: &str, body: Value) -> anyhow::Result<Value> {
        if self.auth.is_some() && self.token.is_none() {
            self.authenticate()?;
        }
        let body = body.to_string();
        match self.call_once(path, &body) {
            Err(e) if self.auth.is_some() && is_code(&e, GRPC_UNAUTHENTICATED) => {
                self.token = None;
                self.authenticate()?;
                self.call_once(path, &body)
            }
            r => r,
        }
    }

    fn authenticate(&mut self) -> anyhow::Result<()> {
        let Some((user, pw)) = &self.auth else {
            return Ok(());
        };
        let user = user.clone();
        // The body holds the password: zeroized when dropped.
        let body = Zeroizing::new(json!({"name": user, "password": pw.as_str()}).to_string());
        let v = self
            .call_once("/v3/auth/authenticate", &body)
            .with_context(|| format!("[ha] etcd_user {user:?}: authentication"))?;
        let tok = v["token"]
            .as_str()
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                anyhow!("etcd gave no token for etcd_user {user:?}: is auth enabled there?")
            })?;
        self.token = Some(Zeroizing::new(tok.to_string()));
        Ok(())
    }

    /// Grants a lease and puts the key with it if the key is absent.
    fn campaign(&mut self) -> anyhow::Result<Option<i64>> {
        let g = self.call("/v3/lease/grant", json!({"TTL": self.ttl_s.to_string()}))?;
        let id = int(&g["ID"]).filter(|&id| id != 0).ok_or_else(|| {
            anyhow!(
                "lease grant: no lease ID in the answer: {:.200}",
                g.to_string()
            )
        })?;
        let (key, value) = (self.key.clone(), B64.encode(&self.node));
        let txn = json!({
            "compare": [{"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
            "success": [{"request_put": {"key": key, "value": value, "lease": id.to_string()}}],
        });
        match self.call("/v3/kv/txn", txn) {
            Ok(r) if r["succeeded"].as_bool() == Some(true) => {
                self.rev = header_rev(&r).or(self.rev);
                Ok(Some(id))
            }
            other => {
                if let Ok(r) = &other {
                    self.rev = header_rev(r).or(self.rev);
                }
                // Lost (or failed): give the unused lease back; it would expire anyway.
                let _ = self.call("/v3/lease/revoke", json!({"ID": id.to_string()}));
                other.map(|_| None)
            }
        }
    }
}

impl EtcdStore {
    /// `KEY/sub` (base64) for a value kept beside the lease's key.
    fn sub_key(&self, sub: &str) -> anyhow::Result<String> {
        let key = B64
            .decode(&self.key)
            .map_err(|e| anyhow!("the lease key is not base64: {e}"))?;
        let mut k = key;
        k.push(b'/');
        k.extend_from_slice(sub.as_bytes());
        Ok(B64.encode(k))
    }

    /// Puts `value` at `KEY/sub` only while the lease's key names this
    /// node (one transaction): Ok(false) when it does not.
    pub fn put_if_holder(&mut self, sub: &str, value: &[u8]) -> anyhow::Result<bool> {
        let (key, k) = (self.key.clone(), self.sub_key(sub)?);
        let txn = json!({
            "compare": [{"key": key, "target": "VALUE", "result": "EQUAL", "value": B64.encode(&self.node)}],
            "success": [{"request_put": {"key": k, "value": B64.encode(value)}}],
        });
        let r = self.call("/v3/kv/txn", txn)?;
        Ok(r["succeeded"].as_bool() == Some(true))
    }

    /// The value at `KEY/sub`, None if absent.
    pub fn get_under_key(&mut self, sub: &str) -> anyhow::Result<Option<Vec<u8>>> {
        let r = self.call("/v3/kv/range", json!({"key": self.sub_key(sub)?}))?;
        let Some(v) = r["kvs"].get(0) else {
            return Ok(None);
        };
        let bytes = B64
            .decode(v["value"].as_str().unwrap_or(""))
            .map_err(|e| anyhow!("range {sub}: the value is not base64: {e}"))?;
        Ok(Some(bytes))
    }
}

impl LeaseStore for EtcdStore {
    fn try_acquire(&mut self) -> anyhow::Result<bool> {
        if self.lease.is_some() {
            return Ok(true);
        }
        let Some(id) = self.campaign()? else {
            return Ok(false);
        };
        self.lease = Some(id);
        Ok(true)
    }

    fn renew(&mut self) -> anyhow::Result<bool> {
        let Some(id) = self.lease else {
            return Ok(false);
        };
        // One request, one answer: the answer is to this request, sent after
        // the send time the fence deadline counts from.
        let r = self
            .call("/v3/lease/keepalive", json!({"ID": id.to_string()}))
            .context("keepalive")?;
        if int(&r["TTL"]).unwrap_or(0) > 0 {
            Ok(true)
        } else {
            self.lease = None; // TTL 0 (omitted): expired or revoked
            Ok(false)
        }
    }

    fn release(&mut self) -> anyhow::Result<()> {
        if let Some(id) = self.lease.take() {
            match self.call("/v3/lease/revoke", json!({"ID": id.to_string()})) {
                Err(e) if !is_code(&e, GRPC_NOT_FOUND) => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    fn holder(&mut self) -> anyhow::Result<Option<String>> {
        let r = self.call("/v3/kv/range", json!({"key": self.key}))?;
        self.rev = header_rev(&r).or(self.rev);
        let Some(v) = r["kvs"].get(0) else {
            return Ok(None);
        };
        let bytes = B64
            .decode(v["value"].as_str().unwrap_or(""))
            .map_err(|e| anyhow!("range: the key's value is not base64: {e}"))?;
        Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
    }

    /// A watch from just after the last revision read: returns on its first
    /// event (or cancel or compaction), at `max`, or when etcd ends it.
    fn wait_change(&mut self, max: Duration) -> anyhow::Result<()> {
        if self.auth.is_some() && self.token.is_none() {
            self.authenticate()?;
        }
        let mut create = json!({"key": self.key});
        if let Some(r) = self.rev {
            create["start_revision"] = json!((r + 1).to_string());
        }
        let body = json!({ "create_request": create }).to_string();
        let r = self.send("/v3/watch", &body, max)?;
        let ok = r.status().is_success();
        let mut body = r.into_body();
        let reader = body.with_config().limit(MAX_RESPONSE_BYTES).reader();
        let mut lines = std::io::BufReader::new(reader);
        let mut line = String::new();
        loop {
            line.clear();
            match lines.read_line(&mut line) {
                Ok(0) => return Ok(()),
                Ok(_) => {
                    let v: Value = serde_json::from_str(&line)
                        .map_err(|e| anyhow!("watch: not JSON ({e}): {line:.200}"))?;
                    if let Err(e) = refusal(&v, ok) {
                        if is_code(&e, GRPC_UNAUTHENTICATED) {
                            self.token = None; // fetched again on the next call
                        }
                        return Err(e.context("watch"));
                    }
                    let m = &v["result"];
                    let changed = m["events"].as_array().is_some_and(|e| !e.is_empty());
                    if changed || m["canceled"] == true || int(&m["compact_revision"]) > Some(0) {
                        return Ok(());
                    }
                }
                Err(e) if is_timeout(&e) => return Ok(()),
                Err(e) => return Err(anyhow!("watch: {e}")),
            }
        }
    }
}

/// etcd's error in an answer, if any: a non-2xx status with
/// {"error"|"message", "code"} (gateway v1, etcd 3.4/3.5; v2, etcd 3.6),
/// or a stream message {"error": {"grpc_code"|"code", "message"}}.
fn refusal(v: &Value, status_ok: bool) -> anyhow::Result<()> {
    let e = &v["error"];
    if status_ok && !e.is_object() {
        return Ok(());
    }
    let (src, code) = if e.is_object() {
        (e, int(&e["grpc_code"]).or(int(&e["code"])))
    } else {
        (v, int(&v["code"]))
    };
    let message = src["message"]
        .as_str()
        .or(src["error"].as_str())
        .unwrap_or("no message")
        .to_string();
    Err(Refused {
        code: code.unwrap_or(-1),
        message,
    }
    .into())
}

fn is_code(e: &anyhow::Error, code: i64) -> bool {
    e.downcast_ref::<Refused>().is_some_and(|r| r.code == code)
}

fn is_timeout(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::TimedOut
        || e.get_ref()
            .and_then(|x| x.downcast_ref::<ureq::Error>())
            .is_some_and(|x| matches!(x, ureq::Error::Timeout(_)))
}

/// A 64-bit integer of the JSON mapping: a string, or a number.
fn int(v: &Value) -> Option<i64> {
    v.as_str().and_then(|s| s.parse().ok()).or(v.as_i64())
}

fn header_rev(v: &Value) -> Option<i64> {
    int(&v["header"]["revision"])
}

/// "host:port" → "http://host:port" (https when TLS options are set); a
/// URL is kept, without a trailing slash.
fn base_url(e: &str, tls: bool) -> String {
    let e = e.trim_end_matches('/');
    if e.contains("://") {
        e.to_string()
    } else if tls {
        format!("https://{e}")
    } else {
        format!("http://{e}")
    }
}

/// Reads a file of at most [`MAX_SECRET_FILE_BYTES`].
fn read_small(what: &str, p: &Path) -> anyhow::Result<Vec<u8>> {
    use std::io::Read;
    let f = std::fs::File::open(p).with_context(|| format!("[ha] {what} {}", p.display()))?;
    let mut buf = Vec::new();
    f.take(MAX_SECRET_FILE_BYTES + 1).read_to_end(&mut buf)?;
    ensure!(
        buf.len() as u64 <= MAX_SECRET_FILE_BYTES,
        "[ha] {what} {}: larger than {MAX_SECRET_FILE_BYTES} bytes",
        p.display()
    );
    Ok(buf)
}

/// A secret file must be its owner's alone (as ssh wants of a private key).
fn check_secret_mode(what: &str, p: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(p).with_context(|| format!("[ha] {what} {}", p.display()))?;
    let mode = meta.permissions().mode() & 0o777;
    ensure!(
        mode & 0o077 == 0,
        "[ha] {what} {} has mode {mode:03o}: its group or others may read it: chmod 600 {}",
        p.display(),
        p.display()
    );
    Ok(())
}

/// `etcd_password_file`: 0600, the password on its first line (a trailing
/// newline is not part of it), never printed.
fn read_password(p: &Path) -> anyhow::Result<Zeroizing<String>> {
    check_secret_mode("etcd_password_file", p)?;
    let raw = Zeroizing::new(read_small("etcd_password_file", p)?);
    let text = std::str::from_utf8(&raw)
        .map_err(|_| anyhow!("[ha] etcd_password_file {}: not UTF-8", p.display()))?;
    let pw = text.lines().next().unwrap_or("");
    ensure!(
        !pw.is_empty(),
        "[ha] etcd_password_file {} is empty: put the password in it",
        p.display()
    );
    Ok(Zeroizing::new(pw.to_string()))
}

/// The certificates of a PEM file (at least one).
fn read_certs(what: &str, p: &Path) -> anyhow::Result<Vec<Certificate<'static>>> {
    let pem = read_small(what, p)?;
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        if let PemItem::Certificate(c) =
            item.map_err(|e| anyhow!("[ha] {what} {}: {e}", p.display()))?
        {
            certs.push(c);
        }
    }
    ensure!(
        !certs.is_empty(),
        "[ha] {what} {}: no PEM certificate in it",
        p.display()
    );
    Ok(certs)
}

/// The TLS settings: OpenSSL (native-tls), the CA file or the system's
/// roots, the client certificate if set.
fn tls_config(cfg: &HaConfig) -> anyhow::Result<TlsConfig> {
    let roots = match &cfg.etcd_ca_file {
        Some(p) => RootCerts::new_with_certs(&read_certs("etcd_ca_file", p)?),
        None => RootCerts::PlatformVerifier,
    };
    let mut b = TlsConfig::builder()
        .provider(TlsProvider::NativeTls)
        .root_certs(roots);
    if let (Some(c), Some(k)) = (&cfg.etcd_cert_file, &cfg.etcd_key_file) {
        let chain = read_certs("etcd_cert_file", c)?;
        check_secret_mode("etcd_key_file", k)?;
        let pem = Zeroizing::new(read_small("etcd_key_file", k)?);
        // Any PEM key (PKCS#8, RSA, EC) as PKCS#8, which native-tls takes.
        let pkcs8 = openssl::pkey::PKey::private_key_from_pem(&pem)
            .and_then(|k| k.private_key_to_pem_pkcs8())
            .map_err(|e| {
                anyhow!(
                    "[ha] etcd_key_file {}: not a PEM private key: {e}",
                    k.display()
                )
            })?;
        let pkcs8 = Zeroizing::new(pkcs8);
        let key = PrivateKey::from_pem(&pkcs8)
            .map_err(|e| anyhow!("[ha] etcd_key_file {}: {e}", k.display()))?;
        b = b.client_cert(Some(ClientCert::new_with_certs(&chain, key)));
    }
    Ok(b.build())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_of_both_gateway_versions_and_of_streams_are_refusals() {
        let v1 = json!({"error": "etcdserver: user name is empty", "code": 3, "message": "etcdserver: user name is empty"});
        let e = refusal(&v1, false).unwrap_err();
        assert!(e.to_string().contains("user name is empty"), "{e}");
        assert!(is_code(&e, 3));
        let v2 = json!({"code": 16, "message": "etcdserver: invalid auth token", "details": []});
        assert!(is_code(
            &refusal(&v2, false).unwrap_err(),
            GRPC_UNAUTHENTICATED
        ));
        let stream = json!({"error": {"grpc_code": 16, "http_code": 401, "message": "etcdserver: invalid auth token"}});
        assert!(is_code(
            &refusal(&stream, true).unwrap_err(),
            GRPC_UNAUTHENTICATED
        ));
        assert!(refusal(&json!({"result": {"TTL": "5"}}), true).is_ok());
    }

    #[test]
    fn integers_are_strings_or_numbers_and_endpoints_get_a_scheme() {
        assert_eq!(
            int(&json!("7587862072907553537")),
            Some(7587862072907553537)
        );
        assert_eq!(int(&json!(5)), Some(5));
        assert_eq!(int(&Value::Null), None);
        assert_eq!(base_url("127.0.0.1:2379", false), "http://127.0.0.1:2379");
        assert_eq!(base_url("10.0.0.1:2379", true), "https://10.0.0.1:2379");
        assert_eq!(base_url("https://e:2379/", false), "https://e:2379");
    }
}

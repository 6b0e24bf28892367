//! The lease in etcd (v3 API, 3.4 or newer), through the etcd-client
//! crate: a lease grant, then a transaction that puts the key bound to that
//! lease only if the key does not exist (its create revision is 0), a
//! keepalive stream while we hold it, a watch on the key while we wait. The
//! key disappears when the lease expires or is revoked, which is what lets
//! the standby in. Every call runs on a single-threaded tokio runtime owned
//! by the lease thread, bounded by `op_timeout_ms`.

use super::{HaConfig, LeaseStore};
use anyhow::{anyhow, Context};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, LeaseKeepAliveStream, LeaseKeeper, PutOptions, Txn,
    TxnOp, WatchStream, Watcher,
};
use std::time::Duration;
use tokio::runtime::Runtime;

pub struct EtcdStore {
    rt: Runtime,
    client: Client,
    key: String,
    node: String,
    ttl_s: i64,
    timeout: Duration,
    /// The lease we hold the key with.
    lease: Option<i64>,
    /// Its keepalive stream. Dropped after a timeout or an error, so that a
    /// late answer to an old request is never taken for the answer to a
    /// newer one (whose send time the fence deadline counts from).
    keep: Option<(LeaseKeeper, LeaseKeepAliveStream)>,
    /// The watch on the key (made on first wait, remade after an error).
    watch: Option<(Watcher, WatchStream)>,
}

impl EtcdStore {
    pub fn connect(cfg: &HaConfig) -> anyhow::Result<EtcdStore> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let timeout = cfg.op_timeout();
        let opts = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_timeout(timeout);
        let eps = cfg.endpoints.clone();
        let client = rt
            .block_on(async {
                tokio::time::timeout(timeout, Client::connect(eps, Some(opts))).await
            })
            .map_err(|_| anyhow!("no answer within op_timeout_ms"))
            .and_then(|r| r.map_err(anyhow::Error::from))
            .with_context(|| {
                format!(
                    "[ha] etcd at {}: cannot connect: is etcd running there?",
                    cfg.endpoints.join(",")
                )
            })?;
        // Whole seconds (validate() asks for a multiple of 1000 ms).
        let ttl_s = (cfg.lease_ttl_ms / 1000).max(1) as i64;
        Ok(EtcdStore {
            rt,
            client,
            key: cfg.key.clone(),
            node: cfg.node.clone(),
            ttl_s,
            timeout,
            lease: None,
            keep: None,
            watch: None,
        })
    }

    /// Runs `f` on the runtime, bounded by the operation timeout.
    fn run<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
    ) -> anyhow::Result<T> {
        let t = self.timeout;
        self.rt
            .block_on(async { tokio::time::timeout(t, f).await })
            .map_err(|_| anyhow!("etcd did not answer within op_timeout_ms ({t:?})"))?
            .map_err(anyhow::Error::from)
    }

    /// Grants a lease and puts the key with it if the key is absent.
    fn campaign(&mut self) -> anyhow::Result<Option<i64>> {
        let mut c = self.client.clone();
        let ttl = self.ttl_s;
        let id = self
            .run(async move { c.lease_grant(ttl, None).await })?
            .id();
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.as_str(),
                CompareOp::Equal,
                0,
            )])
            .and_then([TxnOp::put(
                self.key.as_str(),
                self.node.as_str(),
                Some(PutOptions::new().with_lease(id)),
            )]);
        let mut c = self.client.clone();
        let won = self.run(async move { c.txn(txn).await });
        match won {
            Ok(r) if r.succeeded() => Ok(Some(id)),
            other => {
                // Lost (or failed): give the unused lease back; it would expire anyway.
                let mut c = self.client.clone();
                let _ = self.run(async move { c.lease_revoke(id).await });
                other.map(|_| None)
            }
        }
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
        // Held from here; the keepalive stream opens on the first renew.
        self.lease = Some(id);
        Ok(true)
    }

    fn renew(&mut self) -> anyhow::Result<bool> {
        let Some(id) = self.lease else {
            return Ok(false);
        };
        if self.keep.is_none() {
            let mut c = self.client.clone();
            self.keep = Some(self.run(async move { c.lease_keep_alive(id).await })?);
        }
        let Some((keeper, stream)) = self.keep.as_mut() else {
            return Ok(false);
        };
        let t = self.timeout;
        let r = self.rt.block_on(async {
            tokio::time::timeout(t, async {
                keeper.keep_alive().await?;
                stream.message().await
            })
            .await
        });
        match r {
            Err(_) => {
                self.keep = None;
                Err(anyhow!(
                    "keepalive not answered within op_timeout_ms ({t:?})"
                ))
            }
            Ok(Err(e)) => {
                self.keep = None;
                Err(anyhow::Error::from(e).context("keepalive"))
            }
            Ok(Ok(Some(resp))) if resp.ttl() > 0 => Ok(true),
            Ok(Ok(Some(_))) => {
                (self.lease, self.keep) = (None, None); // TTL 0: expired or revoked
                Ok(false)
            }
            Ok(Ok(None)) => {
                self.keep = None; // the stream ended; the next renew opens another
                Err(anyhow!("keepalive stream closed by etcd"))
            }
        }
    }

    fn release(&mut self) -> anyhow::Result<()> {
        self.keep = None;
        if let Some(id) = self.lease.take() {
            let mut c = self.client.clone();
            self.run(async move { c.lease_revoke(id).await })?;
        }
        Ok(())
    }

    fn holder(&mut self) -> anyhow::Result<Option<String>> {
        let mut c = self.client.clone();
        let key = self.key.clone();
        let r = self.run(async move { c.get(key, None).await })?;
        Ok(r.kvs()
            .first()
            .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()))
    }

    fn wait_change(&mut self, max: Duration) -> anyhow::Result<()> {
        if self.watch.is_none() {
            let mut c = self.client.clone();
            let key = self.key.clone();
            self.watch = Some(self.run(async move { c.watch(key, None).await })?);
        }
        let Some((_, stream)) = self.watch.as_mut() else {
            return Ok(());
        };
        match self
            .rt
            .block_on(async { tokio::time::timeout(max, stream.message()).await })
        {
            Err(_) | Ok(Ok(Some(_))) => Ok(()), // timed out, or an event
            Ok(Ok(None)) => {
                self.watch = None;
                Ok(())
            }
            Ok(Err(e)) => {
                self.watch = None;
                Err(e.into())
            }
        }
    }
}

//! The fleet's board: keys under `/holdfast/<name>/board/` that members post for each
//! other and every member mirrors (through the same etcd watch as `switching`). A key is
//! posted either by a member under its own lease (it goes when the member goes), or by
//! the leader, fenced: etcd takes it only while the leader's election key is still the one
//! of its epoch, so a leader that lost the lead without noticing yet posts nothing.
//!
//! The serverless instance's coordination lives here (the leader's phase, each member's
//! idleness and wakes, the usage meter's lines); the board itself knows nothing of it.

use crate::{prefix, Fleet};
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use serde::{de::DeserializeOwned, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::watch;

/// One key of the board as this member mirrors it.
#[derive(Debug, Clone)]
pub struct Posted {
    pub value: Vec<u8>,
    /// When this member saw it posted (its own clock: the age of what another member said).
    pub seen_at: Instant,
}

impl Posted {
    /// The value, read as `T` (`None`: not a `T`).
    pub fn read<T: DeserializeOwned>(&self) -> Option<T> {
        serde_json::from_slice(&self.value).ok()
    }
}

/// The board's keys (relative to `board/`), as this member mirrors them.
pub type Board = Arc<BTreeMap<String, Posted>>;

/// Who posts a key, and so how long it lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Poster {
    /// This member, under its lease.
    Member,
    /// The leader, fenced by its epoch; it stays after the leader goes.
    Leader,
}

/// The board's directory under the fleet's prefix.
pub(crate) fn board_dir(name: &str) -> String {
    format!("{}board/", prefix(name))
}

/// Applies etcd's full read of the prefix to the mirror.
pub(crate) fn mirror_all(tx: &watch::Sender<Board>, dir: &str, kvs: &[etcd_client::KeyValue]) {
    let now = Instant::now();
    let mut all = BTreeMap::new();
    for kv in kvs {
        if let Some(key) = kv.key_str().ok().and_then(|k| k.strip_prefix(dir)) {
            all.insert(
                key.to_string(),
                Posted {
                    value: kv.value().to_vec(),
                    seen_at: now,
                },
            );
        }
    }
    tx.send_replace(Arc::new(all));
}

/// Applies one watch event to the mirror (a key outside the board is left alone).
pub(crate) fn mirror_event(tx: &watch::Sender<Board>, dir: &str, event: &etcd_client::Event) {
    let Some(kv) = event.kv() else {
        return;
    };
    let Some(key) = kv.key_str().ok().and_then(|k| k.strip_prefix(dir)) else {
        return;
    };
    let put = event.event_type() == etcd_client::EventType::Put;
    tx.send_modify(|board| {
        let board = Arc::make_mut(board);
        if put {
            board.insert(
                key.to_string(),
                Posted {
                    value: kv.value().to_vec(),
                    seen_at: Instant::now(),
                },
            );
        } else {
            board.remove(key);
        }
    });
}

impl Fleet {
    /// The board as this member mirrors it, as it changes.
    pub fn board(&self) -> watch::Receiver<Board> {
        self.board.clone()
    }

    /// Posts `value` at `key` (under `board/`). False when etcd did not take it within the
    /// lease's TTL, or, for [`Poster::Leader`], when this member does not lead (or no
    /// longer does, as etcd says).
    pub async fn post(&self, key: &str, value: &impl Serialize, by: Poster) -> bool {
        let Ok(value) = serde_json::to_vec(value) else {
            return false;
        };
        let Some((mut client, lease)) = self.connection() else {
            return false;
        };
        let key = format!("{}{key}", board_dir(&self.name));
        let posted = async {
            match by {
                Poster::Member => client
                    .put(key, value, Some(PutOptions::new().with_lease(lease)))
                    .await
                    .is_ok(),
                Poster::Leader => {
                    let Some(proof) = self.proof.lock().ok().and_then(|p| p.clone()) else {
                        return false;
                    };
                    // Only while the election key is the one this member won.
                    let txn = Txn::new()
                        .when([Compare::create_revision(
                            proof.key.clone(),
                            CompareOp::Equal,
                            proof.epoch,
                        )])
                        .and_then([TxnOp::put(key, value, None)]);
                    client.txn(txn).await.is_ok_and(|r| r.succeeded())
                }
            }
        };
        tokio::time::timeout(self.ttl, posted)
            .await
            .unwrap_or(false)
    }

    /// The board's `key` as etcd says now (not the mirror, which may lag by a moment):
    /// `None` when it is not there or etcd did not answer within the lease's TTL.
    pub async fn fetch(&self, key: &str) -> Option<Posted> {
        let (mut client, _) = self.connection()?;
        let key = format!("{}{key}", board_dir(&self.name));
        let got = tokio::time::timeout(self.ttl, client.get(key, None))
            .await
            .ok()?
            .ok()?;
        let kv = got.kvs().first()?;
        Some(Posted {
            value: kv.value().to_vec(),
            seen_at: Instant::now(),
        })
    }

    /// Deletes the board's keys under `dir` (relative to `board/`) that sort before
    /// `keep_from`, as the leader (fenced as [`Fleet::post`]). False when not done.
    pub async fn clear_before(&self, dir: &str, keep_from: &str) -> bool {
        let Some((mut client, _)) = self.connection() else {
            return false;
        };
        let Some(proof) = self.proof.lock().ok().and_then(|p| p.clone()) else {
            return false;
        };
        let base = format!("{}{dir}", board_dir(&self.name));
        let cleared = async {
            let all = client
                .get(
                    base.as_str(),
                    Some(GetOptions::new().with_prefix().with_keys_only()),
                )
                .await
                .ok()?;
            let old: Vec<TxnOp> = all
                .kvs()
                .iter()
                .filter(|kv| {
                    kv.key_str()
                        .ok()
                        .and_then(|k| k.strip_prefix(&base))
                        .is_some_and(|k| k < keep_from)
                })
                .map(|kv| TxnOp::delete(kv.key().to_vec(), None))
                .collect();
            if old.is_empty() {
                return Some(true);
            }
            let txn = Txn::new()
                .when([Compare::create_revision(
                    proof.key.clone(),
                    CompareOp::Equal,
                    proof.epoch,
                )])
                .and_then(old);
            Some(client.txn(txn).await.ok()?.succeeded())
        };
        matches!(
            tokio::time::timeout(self.ttl, cleared).await,
            Ok(Some(true))
        )
    }
}

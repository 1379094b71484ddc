//! Per-claim serialization: calls for one claim UID run one after another, in arrival order;
//! calls for different claims never wait for each other. No node-wide lock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// A keyed async lock: one [`tokio::sync::Mutex`] per claim UID, created on first use and
/// dropped when nobody holds or waits for it (so the map does not grow with every claim ever
/// seen). Fair: waiters get the lock in arrival order.
#[derive(Debug, Default)]
pub struct ClaimLocks {
    map: Mutex<HashMap<String, Arc<AsyncMutex<()>>>>,
}

/// Holds the lock of one claim until dropped.
#[derive(Debug)]
pub struct ClaimGuard<'a> {
    guard: Option<OwnedMutexGuard<()>>,
    uid: String,
    locks: &'a ClaimLocks,
}

impl ClaimLocks {
    /// Waits for and takes the lock of claim `uid`.
    pub async fn lock(&self, uid: &str) -> ClaimGuard<'_> {
        let mutex = self.entry(uid);
        let guard = mutex.lock_owned().await;
        ClaimGuard {
            guard: Some(guard),
            uid: uid.to_string(),
            locks: self,
        }
    }

    /// Takes the lock of claim `uid` if nobody holds or waits for it.
    pub fn try_lock(&self, uid: &str) -> Option<ClaimGuard<'_>> {
        let mutex = self.entry(uid);
        let guard = mutex.try_lock_owned().ok();
        let Some(guard) = guard else {
            self.release_entry(uid);
            return None;
        };
        Some(ClaimGuard {
            guard: Some(guard),
            uid: uid.to_string(),
            locks: self,
        })
    }

    /// Number of claims with a holder or a waiter (for tests).
    pub fn in_use(&self) -> usize {
        self.map.lock().expect("claim locks").len()
    }

    fn entry(&self, uid: &str) -> Arc<AsyncMutex<()>> {
        self.map
            .lock()
            .expect("claim locks")
            .entry(uid.to_string())
            .or_default()
            .clone()
    }

    /// Drops the map entry of `uid` when only the map refers to it. Callers hold no clone.
    fn release_entry(&self, uid: &str) {
        let mut map = self.map.lock().expect("claim locks");
        if map.get(uid).is_some_and(|m| Arc::strong_count(m) == 1) {
            map.remove(uid);
        }
    }
}

impl Drop for ClaimGuard<'_> {
    fn drop(&mut self) {
        // Unlock first (the guard owns a clone of the mutex), then drop the entry if unused.
        drop(self.guard.take());
        self.locks.release_entry(&self.uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn one_claim_waits_other_claims_do_not() {
        let locks = Arc::new(ClaimLocks::default());
        let a = locks.lock("a").await;
        // Another claim is not held up.
        let b = tokio::time::timeout(Duration::from_millis(100), locks.lock("b")).await;
        assert!(b.is_ok(), "claim b waited for claim a");
        drop(b);
        assert!(locks.try_lock("a").is_none());
        let l = locks.clone();
        let waiter = tokio::spawn(async move {
            let _g = l.lock("a").await;
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "the second call for claim a waits");
        drop(a);
        waiter.await.unwrap();
        assert_eq!(locks.in_use(), 0, "entries are dropped when unused");
    }

    #[tokio::test]
    async fn waiters_get_the_lock_in_arrival_order() {
        let locks = Arc::new(ClaimLocks::default());
        let first = locks.lock("a").await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..5 {
            let (l, o) = (locks.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let _g = l.lock("a").await;
                o.lock().unwrap().push(i);
            }));
            tokio::task::yield_now().await;
        }
        drop(first);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
    }
}

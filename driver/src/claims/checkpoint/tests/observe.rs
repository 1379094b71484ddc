//! [`CheckpointStore::observe`]: the observer sees the checkpoint when set and after every
//! change, in order, whichever call made it.

use std::sync::{Arc, Mutex};

use super::*;

#[tokio::test]
async fn an_observer_sees_every_change_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::new(Checkpoint::new(BOOT), dir.path().join("cp.json"));
    let seen: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
    let uids = |cp: &Checkpoint| cp.claims.keys().cloned().collect::<Vec<_>>();
    {
        let seen = seen.clone();
        assert!(store.observe(move |cp| seen.lock().unwrap().push(uids(cp))));
    }
    store.change(|cp| cp.set_started("uid-1", "ns", "claim-1", vec![device("gpu", 6)]));
    store
        .commit(|cp| cp.set_started("uid-2", "ns", "claim-2", vec![device("gpu", 4)]))
        .await
        .unwrap();
    store.change(|cp| {
        cp.remove("uid-1");
    });
    // A read is no change.
    store.read(|_| ());
    assert_eq!(
        *seen.lock().unwrap(),
        vec![
            vec![],
            vec!["uid-1".to_string()],
            vec!["uid-1".to_string(), "uid-2".to_string()],
            vec!["uid-2".to_string()],
        ]
    );
    // One observer per store: a second is refused and never called.
    let other = Arc::new(Mutex::new(0));
    let counted = other.clone();
    assert!(!store.observe(move |_| *counted.lock().unwrap() += 1));
    store.change(|_| ());
    assert_eq!(*other.lock().unwrap(), 0);
    assert_eq!(seen.lock().unwrap().len(), 5);
}

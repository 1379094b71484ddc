//! Unit tests of [`super`] (`handover/`): the locks, the gate, the background tasks and the
//! handover between two instances.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use das_runtime::probes::Probe;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::driver::{ClaimRef, Driver, PreparedDevice};

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dra-handover-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[tokio::test]
async fn a_second_instance_waits_and_the_active_one_sees_it() {
    let d = dir("wait");
    let active = Active::try_acquire(&d).unwrap().expect("free lock");
    assert!(Active::try_acquire(&d).unwrap().is_none(), "one active");
    assert!(!active.handover_requested(), "nobody waits yet");

    let d2 = d.clone();
    let waiter =
        tokio::spawn(async move { take_over(&d2, Duration::from_millis(5)).await.unwrap() });
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !active.handover_requested() {
        assert!(std::time::Instant::now() < deadline, "waiter not seen");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter waits while we are active"
    );
    drop(active);
    let new = waiter.await.unwrap();
    assert!(!new.handover_requested(), "the waiter's request is gone");
}

#[test]
fn a_stale_wait_file_is_no_request() {
    let d = dir("stale");
    std::fs::write(d.join(WAIT_FILE), b"").unwrap();
    let active = Active::try_acquire(&d).unwrap().unwrap();
    assert!(!active.handover_requested());
}

#[test]
fn a_dead_instance_leaves_the_lock_free() {
    let d = dir("dead");
    drop(Active::try_acquire(&d).unwrap().unwrap());
    assert!(Active::try_acquire(&d).unwrap().is_some());
}

#[tokio::test]
async fn close_waits_for_calls_in_flight_and_refuses_new_ones() {
    let gate = Arc::new(Gate::default());
    let pass = gate.enter().await.expect("open");
    let g = gate.clone();
    let closing = tokio::spawn(async move { g.close().await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!closing.is_finished(), "close waits for the call in flight");
    assert!(gate.enter().await.is_none(), "no new calls once closing");
    drop(pass);
    closing.await.unwrap();
    assert!(gate.is_closed());
}

/// A driver whose prepare takes `delay`.
struct Slow(Duration);
#[tonic::async_trait]
impl Driver for Slow {
    type Error = GateError;
    async fn prepare(
        &self,
        claims: Vec<ClaimRef>,
    ) -> HashMap<String, Result<Vec<PreparedDevice>, GateError>> {
        tokio::time::sleep(self.0).await;
        claims.into_iter().map(|c| (c.uid, Ok(vec![]))).collect()
    }
    async fn unprepare(&self, claims: Vec<ClaimRef>) -> HashMap<String, Result<(), GateError>> {
        claims.into_iter().map(|c| (c.uid, Ok(()))).collect()
    }
}

#[tokio::test]
async fn a_cancelled_call_still_holds_the_gate_until_its_work_ends() {
    let gated = Arc::new(Gated {
        inner: Arc::new(Slow(Duration::from_millis(200))),
        gate: Arc::default(),
    });
    let claim = ClaimRef {
        namespace: "ns".into(),
        name: "c".into(),
        uid: "u1".into(),
    };
    let g = gated.clone();
    let call = tokio::spawn(async move { g.prepare(vec![claim]).await });
    tokio::time::sleep(Duration::from_millis(20)).await;
    call.abort(); // the kubelet gave up
    let t0 = std::time::Instant::now();
    gated.gate.close().await;
    assert!(
        t0.elapsed() >= Duration::from_millis(100),
        "close waited for the abandoned prepare's work ({:?})",
        t0.elapsed()
    );
}

struct Ok1;
#[tonic::async_trait]
impl Driver for Ok1 {
    type Error = GateError;
    async fn prepare(
        &self,
        claims: Vec<ClaimRef>,
    ) -> HashMap<String, Result<Vec<PreparedDevice>, GateError>> {
        claims.into_iter().map(|c| (c.uid, Ok(vec![]))).collect()
    }
    async fn unprepare(&self, claims: Vec<ClaimRef>) -> HashMap<String, Result<(), GateError>> {
        claims.into_iter().map(|c| (c.uid, Ok(()))).collect()
    }
}

#[tokio::test]
async fn a_closed_gate_answers_every_claim_with_the_handover() {
    let gated = Gated {
        inner: Arc::new(Ok1),
        gate: Arc::default(),
    };
    let claim = ClaimRef {
        namespace: "ns".into(),
        name: "c".into(),
        uid: "u1".into(),
    };
    assert!(gated.prepare(vec![claim.clone()]).await["u1"].is_ok());
    gated.gate.close().await;
    let err = gated.unprepare(vec![claim]).await["u1"]
        .clone()
        .unwrap_err();
    assert!(matches!(err, GateError::HandedOver), "{err}");
    assert!(err.to_string().contains("handed over"), "{err}");
}

/// Issue 11 finding 8: the lock files (and the state dir) are closed to other users, so no
/// local process but root can hold a lock on them.
#[test]
fn lock_files_are_0600_in_a_0700_state_dir() {
    let d = dir("modes");
    std::fs::write(d.join(WAIT_FILE), b"").unwrap();
    std::fs::set_permissions(d.join(WAIT_FILE), std::fs::Permissions::from_mode(0o666)).unwrap();
    restrict_state_dir(&d).unwrap();
    let _active = Active::try_acquire(&d).unwrap().unwrap();
    let _waiting = Waiting::announce(&d).unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&d), 0o700);
    assert_eq!(mode(&d.join(LOCK_FILE)), 0o600);
    assert_eq!(
        mode(&d.join(WAIT_FILE)),
        0o600,
        "an older, wider file is narrowed"
    );
}

#[tokio::test]
async fn closing_is_bounded_when_a_call_hangs() {
    let gate = Gate::default();
    let _stuck = gate.enter().await.unwrap();
    assert!(!gate.close_within(Duration::from_millis(50)).await);
    assert!(gate.is_closed(), "no new calls either way");
}

/// Issue 30 item 4: a task that never ends (one waiting for a device call on a wedged device) is
/// aborted at the limit, and stop returns then; the tasks that stopped are not reported.
#[tokio::test(start_paused = true)]
async fn a_background_task_that_never_ends_is_aborted_at_the_limit() {
    let mut background = Background::default();
    let publisher_stop = CancellationToken::new();
    let s = publisher_stop.clone();
    background.spawn(
        "publisher",
        publisher_stop,
        async move { s.cancelled().await },
    );
    let (alive, aborted) = tokio::sync::oneshot::channel::<()>();
    background.spawn("health monitor", CancellationToken::new(), async move {
        let _alive = alive;
        std::future::pending::<()>().await
    });
    let limit = Duration::from_secs(10);
    let t0 = tokio::time::Instant::now();
    let late = tokio::time::timeout(limit * 2, background.stop_within(limit))
        .await
        .expect("stop returns at its limit");
    assert_eq!(late, vec!["health monitor"]);
    assert_eq!(t0.elapsed(), limit, "it waited the limit, no more");
    assert!(aborted.await.is_err(), "the task was aborted (dropped)");
}

#[tokio::test(start_paused = true)]
async fn background_tasks_that_stop_are_not_waited_for_longer() {
    let mut background = Background::default();
    for name in ["publisher", "reaper", "health monitor"] {
        let stop = CancellationToken::new();
        let s = stop.clone();
        background.spawn(name, stop, async move { s.cancelled().await });
    }
    let t0 = tokio::time::Instant::now();
    assert!(background.stop_within(STOP_LIMIT).await.is_empty());
    assert!(t0.elapsed() < Duration::from_millis(1));
}

const TEST_LIMITS: Limits = Limits {
    poll: Duration::from_millis(250),
    drain: Duration::from_secs(60),
    stop: Duration::from_secs(10),
};

/// Issue 30 item 4: an active instance whose health monitor hangs still hands the node over
/// (after the stop limit) instead of holding `plugin.lock` forever.
#[tokio::test(start_paused = true)]
async fn a_hung_background_task_does_not_keep_the_node_from_the_new_instance() {
    let d = dir("hung-background");
    let active = Active::try_acquire(&d).unwrap().unwrap();
    let mut background = Background::default();
    background.spawn(
        "health monitor",
        CancellationToken::new(),
        std::future::pending(),
    );
    let stop = CancellationToken::new();
    let probe = Arc::new(Probe::default());
    probe.set_ready(true);
    let old = tokio::spawn(hand_over_when_asked(
        active,
        Arc::default(),
        background,
        probe.clone(),
        stop.clone(),
        TEST_LIMITS,
    ));
    let bound = TEST_LIMITS.poll * 3 + TEST_LIMITS.stop;
    let new = tokio::time::timeout(bound, take_over(&d, TEST_LIMITS.poll))
        .await
        .expect("handed over within the stop limit")
        .unwrap();
    assert!(!probe.is_ready());
    assert!(!old.is_finished(), "the old instance watches the node");
    stop.cancel();
    assert_eq!(old.await.unwrap(), Ended::Stopped);
    drop(new);
}

/// Issue 30 item 4: calls that hang and a background task that hangs: the instance still
/// ends (to exit) within the drain and stop limits.
#[tokio::test(start_paused = true)]
async fn a_stuck_instance_ends_within_the_drain_and_stop_limits() {
    let d = dir("stuck");
    let active = Active::try_acquire(&d).unwrap().unwrap();
    let gate = Arc::new(Gate::default());
    let _call = gate.enter().await.unwrap();
    let mut background = Background::default();
    background.spawn("reaper", CancellationToken::new(), std::future::pending());
    let stop = CancellationToken::new();
    stop.cancel(); // SIGTERM
    let t0 = tokio::time::Instant::now();
    let ended = tokio::time::timeout(
        TEST_LIMITS.drain + TEST_LIMITS.stop + Duration::from_secs(1),
        hand_over_when_asked(active, gate, background, Arc::default(), stop, TEST_LIMITS),
    )
    .await
    .expect("bounded");
    assert_eq!(ended, Ended::Stuck);
    assert_eq!(t0.elapsed(), TEST_LIMITS.drain + TEST_LIMITS.stop);
}

/// Issue 30 item 4: a new instance whose devices cannot be opened fails before it asks
/// the active instance to hand over, so the active one keeps serving.
#[tokio::test]
async fn a_failing_start_up_check_never_asks_for_the_node() {
    let d = dir("check-fails");
    let active = Arc::new(Active::try_acquire(&d).unwrap().unwrap());
    let seen = active.clone();
    let started = tokio::time::timeout(
        Duration::from_secs(5),
        check_then_take_over(
            &d,
            Duration::from_millis(5),
            move || -> anyhow::Result<()> {
                assert!(!seen.handover_requested(), "checked before asking");
                anyhow::bail!("open the device library (libdevice.so.1): driver not loaded")
            },
        ),
    )
    .await
    .expect("a failed check returns at once, without waiting for the node");
    // The typed error with its cause chain, as the binary prints it (`{:#}` through anyhow).
    let err = format!("{:#}", anyhow::Error::from(started.unwrap_err()));
    assert!(err.contains("open the device library"), "{err}");
    assert!(
        !active.handover_requested(),
        "the active instance was never asked"
    );
}

#[tokio::test]
async fn a_passing_start_up_check_comes_before_the_wait() {
    let d = dir("check-passes");
    let active = Arc::new(Active::try_acquire(&d).unwrap().unwrap());
    let seen = active.clone();
    let d2 = d.clone();
    let starting = tokio::spawn(async move {
        check_then_take_over(
            &d2,
            Duration::from_millis(5),
            move || -> anyhow::Result<bool> { Ok(seen.handover_requested()) },
        )
        .await
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !active.handover_requested() {
        assert!(std::time::Instant::now() < deadline, "waiter not seen");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(active);
    let (asked_while_checking, _new) = tokio::time::timeout(Duration::from_secs(5), starting)
        .await
        .expect("took over")
        .unwrap()
        .unwrap();
    assert!(!asked_while_checking, "no wait announced while checking");
}

/// A driver whose calls panic (a bug).
struct Panics;
#[tonic::async_trait]
impl Driver for Panics {
    type Error = GateError;
    async fn prepare(
        &self,
        _: Vec<ClaimRef>,
    ) -> HashMap<String, Result<Vec<PreparedDevice>, GateError>> {
        panic!("a bug in prepare")
    }
    async fn unprepare(&self, _: Vec<ClaimRef>) -> HashMap<String, Result<(), GateError>> {
        panic!("a bug in unprepare")
    }
}

/// A call whose task panics still answers every claim (with the task's failure), and leaves
/// the gate free to close: the panic released its pass.
#[tokio::test]
async fn a_panicking_call_answers_every_claim_and_releases_the_gate() {
    let gated = Gated {
        inner: Arc::new(Panics),
        gate: Arc::default(),
    };
    let claims: Vec<ClaimRef> = ["u1", "u2"]
        .map(|uid| ClaimRef {
            namespace: "ns".into(),
            name: format!("c-{uid}"),
            uid: uid.into(),
        })
        .to_vec();
    let answers = gated.prepare(claims.clone()).await;
    assert_eq!(answers.len(), 2, "one entry per claim");
    for uid in ["u1", "u2"] {
        let err = answers[uid].clone().unwrap_err();
        assert!(matches!(err, GateError::CallFailed(_)), "{err}");
        assert!(err.to_string().contains("panic"), "{err}");
    }
    let answers = gated.unprepare(claims).await;
    assert!(matches!(answers["u1"], Err(GateError::CallFailed(_))));
    assert!(
        gated.gate.close_within(Duration::from_secs(5)).await,
        "no pass left behind"
    );
}

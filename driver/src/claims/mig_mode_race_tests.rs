//! A MIG instance's prepare and a whole GPU's prepare for one switchable GPU at once (docs/design.md
//! §7, "MIG mode follows demand"): two claims allocated the same GPU in both modes, as a force
//! delete or an allocation made before the GPU stopped switching leaves them, prepared
//! concurrently through many interleavings. Every backend and checkpoint call runs inline behind
//! a seeded number of yields on a single-threaded runtime with paused time, so each case is
//! reproducible; the cases vary which prepare starts first and how late, the GPU's mode at the
//! start, the number of MIG instances, and a fault (a create, or a switch answering `IN_USE` or
//! `RESET_REQUIRED`). Whatever the interleaving: at most one claim is prepared, the GPU's MIG
//! mode is what the prepared one needs, no MIG instance exists on a GPU held whole, a failed
//! prepare leaves no record, and once both claims are unprepared nothing is left (records, CDI
//! specs, instances, switch records).
//!
//! (Emulated latency is not a knob here: the emulated GPU sleeps on the calling thread, which
//! with inline calls delays everything alike; the yields are what reorder the two prepares.)

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::testing::{MemoryApi, NODE, UID_A, UID_B, preparer};
use super::{PrepareError, Preparer};
use crate::blocking::BlockingCalls;
use crate::claims::cdi;
use crate::claims::checkpoint::PrepareState;
use crate::gpu::{EmulatedBackend, FaultKind, GpuBackend};

/// One interleaving.
#[derive(Debug, Clone, Copy)]
struct Case {
    /// Seeds the yields around every inline call, and the late start.
    seed: u64,
    /// MIG mode is on at the start.
    mig_on: bool,
    /// The MIG instance's prepare is spawned first.
    slice_first: bool,
    /// The claim has two MIG instances.
    two_slices: bool,
    fault: Option<(Op, FaultKind)>,
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Create,
    SetMigMode,
}

/// What a case came to: which claim was prepared, and the other's error.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    Slice {
        whole_error: &'static str,
    },
    Whole {
        slice_error: &'static str,
    },
    Neither {
        slice: &'static str,
        whole: &'static str,
    },
}

fn label(r: &Result<Vec<crate::claims::PreparedDevice>, PrepareError>) -> &'static str {
    r.as_ref().err().map_or("ok", PrepareError::metric_label)
}

/// Runs `case` and checks it; returns its outcome.
async fn run(case: Case) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let spec = if case.mig_on {
        "H100-80GB:1"
    } else {
        "H100-80GB:1:mig-off"
    };
    let emu = Arc::new(
        EmulatedBackend::open(spec, NODE, &dir.path().join("emu"))
            .unwrap()
            .with_whole_gpus(true)
            .with_mig_mode_switching(true),
    );
    let rng = Arc::new(Mutex::new(StdRng::seed_from_u64(case.seed)));
    let r = rng.clone();
    let blocking = BlockingCalls::Inline(Arc::new(move || r.lock().unwrap().random_range(0..4)));
    let api = Arc::new(MemoryApi::default());
    let p = Arc::new(preparer(dir.path(), emu.clone(), api.clone(), blocking));
    let mut slices = vec![("gpu", "gpu-0-mig-1g-10gb-0")];
    if case.two_slices {
        slices.push(("extra", "gpu-0-mig-2g-20gb-4"));
    }
    let a = api.allocate("ns", "a", UID_A, &slices);
    let b = api.allocate("ns", "b", UID_B, &[("gpu", "gpu-0")]);
    match case.fault {
        Some((Op::Create, kind)) => emu.inject_create_faults(0, 1, kind),
        Some((Op::SetMigMode, kind)) => emu.inject_set_mig_mode_faults(0, 1, kind),
        None => {}
    }
    let late = rng.lock().unwrap().random_range(0..8);
    let spawn = |claim: crate::claims::ClaimRef, after: u32| {
        let p: Arc<Preparer> = p.clone();
        tokio::spawn(async move {
            for _ in 0..after {
                tokio::task::yield_now().await;
            }
            p.prepare_claim(&claim).await
        })
    };
    let (ta, tb) = if case.slice_first {
        let ta = spawn(a.clone(), 0);
        (ta, spawn(b.clone(), late))
    } else {
        let tb = spawn(b.clone(), 0);
        (spawn(a.clone(), late), tb)
    };
    let (ra, rb) = (ta.await.unwrap(), tb.await.unwrap());
    let mode = emu.mig_mode(0).unwrap();
    let live = emu.instances_on(0).unwrap();
    let state = |uid: &str| p.record_of(uid).map(|r| r.state);
    let outcome = match (&ra, &rb) {
        (Ok(_), Ok(_)) => panic!("{case:?}: both the slices and the whole GPU were prepared"),
        (Ok(_), Err(_)) => {
            assert!(mode.current, "{case:?}: slices prepared with MIG mode off");
            assert_eq!(live.len(), slices.len(), "{case:?}: {live:?}");
            assert_eq!(state(UID_A), Some(PrepareState::PrepareCompleted));
            Outcome::Slice {
                whole_error: label(&rb),
            }
        }
        (Err(_), Ok(_)) => {
            assert!(
                !mode.current,
                "{case:?}: a whole GPU prepared with MIG mode on"
            );
            assert!(
                live.is_empty(),
                "{case:?}: slices on a GPU held whole: {live:?}"
            );
            assert_eq!(state(UID_B), Some(PrepareState::PrepareCompleted));
            Outcome::Whole {
                slice_error: label(&ra),
            }
        }
        (Err(_), Err(_)) => {
            assert!(live.is_empty(), "{case:?}: {live:?}");
            Outcome::Neither {
                slice: label(&ra),
                whole: label(&rb),
            }
        }
    };
    // A failed prepare leaves no record; no switch is left recorded.
    for (r, uid) in [(&ra, UID_A), (&rb, UID_B)] {
        if r.is_err() {
            assert_eq!(state(uid), None, "{case:?}: the failed {uid} left a record");
        }
    }
    p.checkpoint()
        .read(|cp| assert!(cp.mig_mode_switches.is_empty(), "{case:?}"));
    assert_eq!(
        mode.pending, mode.current,
        "{case:?}: a change left pending"
    );
    // Nothing leaks once both are unprepared.
    p.unprepare_claim(&a).await.unwrap();
    p.unprepare_claim(&b).await.unwrap();
    p.checkpoint().read(|cp| {
        assert!(cp.claims.is_empty(), "{case:?}: {:?}", cp.claims.keys());
    });
    assert!(emu.instances_on(0).unwrap().is_empty(), "{case:?}");
    let specs = cdi::list_specs(&dir.path().join("cdi")).unwrap_or_default();
    assert!(specs.is_empty(), "{case:?}: CDI specs left: {specs:?}");
    outcome
}

fn cases() -> Vec<Case> {
    let faults = [
        None,
        Some((Op::Create, FaultKind::Other)),
        Some((Op::SetMigMode, FaultKind::InUse)),
        Some((Op::SetMigMode, FaultKind::ResetRequired)),
    ];
    let mut all = Vec::new();
    for seed in 0..6 {
        for fault in faults {
            for bits in 0..8u8 {
                all.push(Case {
                    seed,
                    mig_on: bits & 1 != 0,
                    slice_first: bits & 2 != 0,
                    two_slices: bits & 4 != 0,
                    fault,
                });
            }
        }
    }
    all
}

#[test]
fn a_slice_and_a_whole_gpu_prepared_at_once_never_both_hold_the_gpu() {
    let mut seen: BTreeMap<Outcome, usize> = BTreeMap::new();
    for case in cases() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        *seen.entry(rt.block_on(run(case))).or_default() += 1;
    }
    eprintln!("{} interleavings: {seen:#?}", cases().len());
    // Both claims win some interleavings; the loser waits for the winner's placement and gives
    // up, or (a failed switch) finds its GPU no longer switched and leaves it to the other.
    let won = |slice: bool, error: &str| {
        seen.keys().any(|o| match o {
            Outcome::Slice { whole_error } => slice && *whole_error == error,
            Outcome::Whole { slice_error } => !slice && *slice_error == error,
            Outcome::Neither { .. } => false,
        })
    };
    for slice in [true, false] {
        for error in ["placement_held", "mig_mode_switch"] {
            assert!(won(slice, error), "slice {slice}, {error}: {seen:?}");
        }
    }
}

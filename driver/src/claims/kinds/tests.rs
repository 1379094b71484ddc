//! Unit tests of the registry ([`super::Kinds`]): every device this node can publish has one
//! kind, the same whether it is asked of the published device or of its record, and the kinds
//! say what the transaction relies on.

use std::collections::BTreeMap;

use super::*;
use crate::claims::checkpoint::Share;
use crate::gpu::{GpuInfo, MigSwitch};
use crate::publish::devices::device_index;

/// An A100 with MIG mode on and an H100 DAS may switch: every MIG placement, its shareable
/// twin, and a whole GPU with its shareable twin.
fn published() -> std::collections::HashMap<String, DeviceRef> {
    let switchable = GpuInfo {
        mig_enabled: false,
        mig_switch: MigSwitch::Allowed,
        ..GpuInfo::for_tests(1, "H100-80GB")
    };
    device_index(&[GpuInfo::for_tests(0, "A100-SXM4-40GB"), switchable])
}

/// The planned device of `name`, as a claim's allocation gives it (a share for a shareable one).
fn planned(name: &str, at: &DeviceRef) -> Planned {
    Planned {
        time_slice: None,
        request: "r".into(),
        pool: "n0".into(),
        device: name.into(),
        at: at.clone(),
        mps: None,
        share: at.shared.then(|| Share {
            id: "s".into(),
            shares: 1,
            of: 4,
            memory_bytes: 0,
        }),
    }
}

#[test]
fn every_published_device_has_one_kind_and_its_record_the_same() {
    let kinds = Kinds::standard();
    let mut seen: BTreeMap<KindId, usize> = BTreeMap::new();
    for (name, at) in published() {
        let serving: Vec<KindId> = kinds
            .all()
            .filter(|k| k.serves(&at))
            .map(|k| k.id())
            .collect();
        // The base kind (last) serves every MIG device; the first that serves is the kind.
        let kind = kinds.of(&at).id();
        assert_eq!(serving.first(), Some(&kind), "{name}: {serving:?}");
        let p = planned(&name, &at);
        assert_eq!(kinds.of_record(&record(&p)).id(), kind, "{name}");
        *seen.entry(kind).or_default() += 1;
    }
    assert_eq!(
        seen.keys().copied().collect::<Vec<_>>(),
        [
            KindId::MigInstance,
            KindId::WholeGpu,
            KindId::SharedSlice,
            KindId::SharedWholeGpu
        ],
        "{seen:?}"
    );
    assert_eq!(seen[&KindId::WholeGpu], 1);
    assert_eq!(seen[&KindId::SharedWholeGpu], 1);
    assert_eq!(seen[&KindId::MigInstance], seen[&KindId::SharedSlice]);
}

#[test]
fn only_whole_gpus_make_no_instance_need_mig_off_and_are_never_carved() {
    let kinds = Kinds::standard();
    for (name, at) in published() {
        let k = kinds.of(&at);
        let exclusive_gpu = k.id() == KindId::WholeGpu;
        let gpu = exclusive_gpu || k.id() == KindId::SharedWholeGpu;
        assert_eq!(k.creates_instance(), !gpu, "{name}");
        assert_eq!(k.gpu_mode() == GpuMode::MigOff, gpu, "{name}");
        assert_eq!(k.carved_before_bind(), !gpu, "{name}");
        assert_eq!(k.shared_by_claims(), at.shared, "{name}");
        // Every kind but the exclusive whole GPU is served with MPS.
        assert_eq!(k.serves_mps(), !exclusive_gpu, "{name}");
        // A whole GPU's node is its own; a shared GPU's node is every share's.
        assert_eq!(k.own_node("/dev/nvidia0"), exclusive_gpu, "{name}");
        assert_eq!(
            k.own_node("/dev/nvidia-caps/nvidia-cap12"),
            !gpu || exclusive_gpu,
            "{name}"
        );
    }
}

/// The MPS daemon of a MIG device is pinned to its MIG instance once it exists; a share of a
/// whole GPU's to the GPU from the start; an exclusive whole GPU has none.
#[test]
fn an_mps_daemon_is_pinned_to_the_instance_or_the_shared_gpu() {
    let kinds = Kinds::standard();
    for (name, at) in published() {
        let mut d = record(&planned(&name, &at));
        let k = kinds.of_record(&d);
        let expected = match k.id() {
            KindId::SharedWholeGpu => Some(at.gpu_uuid.as_str()),
            _ => None,
        };
        assert_eq!(k.mps_uuid(&d), expected, "{name}: before any instance");
        d.instance = Some(InstanceId {
            gi_id: 1,
            ci_id: 0,
            mig_uuid: "MIG-1".into(),
        });
        let expected = match k.id() {
            KindId::WholeGpu => None,
            KindId::SharedWholeGpu => Some(at.gpu_uuid.as_str()),
            _ => Some("MIG-1"),
        };
        assert_eq!(k.mps_uuid(&d), expected, "{name}: with an instance");
    }
}

#[test]
fn a_share_is_owned_by_its_slice_and_any_other_device_by_its_claim() {
    let kinds = Kinds::standard();
    for (name, at) in published() {
        let d = record(&planned(&name, &at));
        let owner = kinds.of_record(&d).owner("claim-uid", &d);
        let expected = if at.shared {
            at.gpu_uuid.as_str()
        } else {
            "claim-uid"
        };
        assert_eq!(owner, expected, "{name}");
    }
}

#[test]
fn an_unpublished_name_is_refused_by_the_kind_it_names() {
    let kinds = Kinds::standard();
    assert_eq!(
        kinds.unpublished("gpu-7".into()).metric_label(),
        "whole_gpu_unavailable"
    );
    assert_eq!(
        kinds
            .unpublished("gpu-0-mig-9g-99gb-0".into())
            .metric_label(),
        "unknown_device"
    );
}

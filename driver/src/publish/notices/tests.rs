//! Unit tests of [`super`] (`notices.rs`): DAS's notes, and their Node events.

use std::sync::Mutex;
use std::time::Duration;

use super::*;

const S: Duration = Duration::from_secs(1);

/// Every note names what it must, and fits an event note.
fn assert_note(notice: Notice, wants: &[&str]) {
    let note = note(&notice, "n0");
    for want in wants {
        assert!(note.contains(want), "{want:?} missing from {note:?}");
    }
    assert!(note.chars().count() <= 1000, "fits an event note");
}

#[test]
fn the_notes_say_what_happened_what_the_plugin_did_and_what_to_do() {
    let dropped = Notice::CountersDropped {
        first: true,
        retry_in: 10 * S,
    };
    assert_note(
        dropped,
        &[
            "DRAPartitionableDevices",
            "kube-apiserver and kube-scheduler",
            "--feature-gates=DRAPartitionableDevices=true",
            "overlapping",
            "withdrawn",
            "n0",
            "mig.das.com",
            "in 10s",
        ],
    );
    assert_note(
        Notice::CountersKept,
        &["DRAPartitionableDevices", "published again"],
    );
    assert_note(
        Notice::TaintsDropped,
        &["DRADeviceTaints", "kube-apiserver"],
    );
    assert_note(Notice::TaintsKept, &["DRADeviceTaints", "again"]);
    assert_note(
        Notice::SharesDropped,
        &[
            "DRAConsumableCapacity",
            "allowMultipleAllocations",
            "kube-apiserver and kube-scheduler",
            "withdrawn",
            "restart",
            "n0",
        ],
    );
    assert_note(
        Notice::BindingConditionsDropped,
        &["DRADeviceBindingConditions", "restart the node plugin"],
    );
}

#[derive(Default)]
struct Posted(Mutex<Vec<(EventTarget, EventKind, String, String)>>);

#[tonic::async_trait]
impl EventSink for Posted {
    async fn event(&self, about: &EventTarget, kind: EventKind, reason: &str, note: String) {
        let event = (about.clone(), kind, reason.to_string(), note);
        self.0.lock().unwrap().push(event);
    }
}

#[tokio::test]
async fn notices_are_posted_about_the_node_in_das_words() {
    let posted = Arc::new(Posted::default());
    let notices = NodeNotices {
        sink: posted.clone(),
    };
    let pool = Pool::new("mig.das.com", "n0");
    for notice in [Notice::TaintsDropped, Notice::TaintsKept] {
        let text = notices.note(&notice, &pool);
        assert_eq!(text, note(&notice, "n0"));
        notices.post(&notice, text).await;
    }
    let posted = posted.0.lock().unwrap();
    assert_eq!(
        posted
            .iter()
            .map(|(about, kind, reason, _)| (about, *kind, reason.as_str()))
            .collect::<Vec<_>>(),
        [
            (
                &EventTarget::Node,
                EventKind::Warning,
                "DeviceTaintsDropped"
            ),
            (&EventTarget::Node, EventKind::Normal, "DeviceTaintsKept"),
        ]
    );
    assert!(posted[0].3.contains("unhealthy GPUs"), "{}", posted[0].3);
}

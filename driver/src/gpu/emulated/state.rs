//! The emulated GPUs' "hardware" state on disk ([`super::STATE_FILE`]): which GPU and compute
//! instances exist on which GPU, and each GPU's MIG mode (now and pending a reset), written
//! atomically after every change and checked against the spec and node name when loaded (the
//! GPUs' index, model and UUID; their MIG mode is the file's, the spec's only seeds a fresh
//! state).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::{EmuGpu, EmulatedError, GI_ID_SPACE, STATE_FILE, STATE_VERSION};
use crate::gpu::MigModeState;
use crate::gpu::layout::Occupancy;

/// On-disk state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct StateFile {
    pub(super) version: u32,
    pub(super) node_name: String,
    /// Serial of the next MIG UUID (never reused).
    pub(super) next_serial: u64,
    pub(super) gpus: Vec<GpuState>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct GpuState {
    pub(super) index: u32,
    pub(super) model: String,
    pub(super) uuid: String,
    /// MIG mode now: the spec's mode (`:mig-on|mig-off`) in a fresh state, then whatever the
    /// plugin switched it to (`GpuBackend::set_mig_mode`). Written only when off
    /// (`"migEnabled": false`), so the file of GPUs with MIG on is what a plugin before `mig-off`
    /// wrote and reads; a file without it reads as MIG on.
    #[serde(default = "mig_on", skip_serializing_if = "is_on")]
    pub(super) mig_enabled: bool,
    /// MIG mode after the next GPU reset (`"migPending"`), written only while it differs from
    /// [`Self::mig_enabled`] (a change waiting for a reset, Ampere); absent, it equals the mode
    /// now, so files written before it existed read fine. Read it with [`Self::mode`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) mig_pending: Option<bool>,
    /// The compute time slice the plugin set (`GpuBackend::set_time_slice`): NVIDIA's level, 0
    /// (the driver's default) to 3. Written only when not 0, so a file without it reads as the
    /// default and files of GPUs never time-sliced stay as they were.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(super) time_slice: u32,
    pub(super) instances: Vec<InstanceState>,
}

impl GpuState {
    /// MIG mode now and after the next reset.
    pub(super) fn mode(&self) -> MigModeState {
        MigModeState {
            current: self.mig_enabled,
            pending: self.mig_pending.unwrap_or(self.mig_enabled),
        }
    }

    /// Sets MIG mode now and after the next reset (the pending mode is kept only while it
    /// differs).
    pub(super) fn set_mode(&mut self, mode: MigModeState) {
        self.mig_enabled = mode.current;
        self.mig_pending = (mode.pending != mode.current).then_some(mode.pending);
    }
}

fn mig_on() -> bool {
    true
}

fn is_on(mig_enabled: &bool) -> bool {
    *mig_enabled
}

fn is_zero(level: &u32) -> bool {
    *level == 0
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct InstanceState {
    pub(super) gi_id: u32,
    pub(super) ci_id: u32,
    pub(super) profile: String,
    pub(super) start: u32,
    pub(super) mig_uuid: String,
    pub(super) created_by_das: bool,
}

/// Moves a state file that cannot be used out of the way (`emulated-gpus.json.corrupt-<secs>`)
/// so the next [`super::EmulatedBackend::open`] starts with empty GPUs. Returns the new path, or `None`
/// when there was no state file.
pub fn move_state_aside(state_dir: &Path) -> io::Result<Option<PathBuf>> {
    let path = state_dir.join(STATE_FILE);
    if !path.exists() {
        return Ok(None);
    }
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let aside = state_dir.join(format!("{STATE_FILE}.corrupt-{secs}"));
    fs::rename(&path, &aside)?;
    Ok(Some(aside))
}

pub(super) fn fresh_state(gpus: &[EmuGpu], node_name: &str) -> StateFile {
    StateFile {
        version: STATE_VERSION,
        node_name: node_name.to_string(),
        next_serial: 0,
        gpus: gpus
            .iter()
            .map(|g| GpuState {
                index: g.index,
                model: g.model.name.clone(),
                uuid: g.uuid.clone(),
                mig_enabled: g.mig_enabled,
                mig_pending: None,
                time_slice: 0,
                instances: Vec::new(),
            })
            .collect(),
    }
}

pub(super) fn load_state(
    path: &Path,
    bytes: &[u8],
    gpus: &[EmuGpu],
    node_name: &str,
) -> Result<StateFile, EmulatedError> {
    let corrupt = |detail: String| EmulatedError::CorruptState {
        path: path.to_path_buf(),
        detail,
    };
    let state: StateFile = serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string()))?;
    if state.version != STATE_VERSION {
        return Err(corrupt(format!(
            "version {} (expected {STATE_VERSION})",
            state.version
        )));
    }
    let expected = fresh_state(gpus, node_name);
    let describe = |s: &StateFile| {
        let gpus: Vec<String> = s
            .gpus
            .iter()
            .map(|g| format!("{}:{}", g.index, g.model))
            .collect();
        format!("node {}, GPUs [{}]", s.node_name, gpus.join(", "))
    };
    // The MIG mode is not compared: the spec's mode is only the initial mode of a fresh state;
    // once the plugin switched a GPU's mode (MIG mode follows demand), the file's is the truth.
    let same_gpus = state.gpus.len() == expected.gpus.len()
        && state
            .gpus
            .iter()
            .zip(&expected.gpus)
            .all(|(a, b)| (a.index, &a.model, &a.uuid) == (b.index, &b.model, &b.uuid));
    if state.node_name != node_name || !same_gpus {
        return Err(EmulatedError::StateMismatch {
            path: path.to_path_buf(),
            detail: format!(
                "file has {}, configured {}",
                describe(&state),
                describe(&expected)
            ),
        });
    }
    for (gpu, gs) in gpus.iter().zip(&state.gpus) {
        replay_instances(gpu, gs).map_err(corrupt)?;
    }
    Ok(state)
}

/// Checks that a GPU's recorded instances are a layout the hardware accepts, with unique IDs
/// (none with MIG mode off), and that a GPU without MIG has MIG mode off.
pub(super) fn replay_instances(gpu: &EmuGpu, gs: &GpuState) -> Result<(), String> {
    if !gpu.model.mig && (gs.mig_enabled || gs.mig_pending == Some(true)) {
        return Err(format!(
            "GPU {} ({}) has no MIG, yet its MIG mode is recorded on",
            gpu.index, gpu.model.name
        ));
    }
    if !gs.mig_enabled && !gs.instances.is_empty() {
        return Err(format!(
            "GPU {}: MIG mode is off, yet {} MIG instances are recorded",
            gpu.index,
            gs.instances.len()
        ));
    }
    let mut occ = Occupancy::empty(&gpu.model);
    let mut gi_ids = Vec::new();
    for inst in &gs.instances {
        let (idx, _) = gpu
            .model
            .profile(&inst.profile)
            .ok_or_else(|| format!("GPU {}: unknown profile {}", gpu.index, inst.profile))?;
        occ.check_hardware(&gpu.model, idx, inst.start)
            .map_err(|c| format!("GPU {}: {} at {}: {c}", gpu.index, inst.profile, inst.start))?;
        if inst.gi_id >= GI_ID_SPACE || gi_ids.contains(&inst.gi_id) {
            return Err(format!(
                "GPU {}: invalid or duplicate GI ID {}",
                gpu.index, inst.gi_id
            ));
        }
        gi_ids.push(inst.gi_id);
        occ.add(&gpu.model, idx, inst.start);
    }
    Ok(())
}

pub(super) fn gpu_state(state: &StateFile, index: u32) -> &GpuState {
    // The state was checked against the GPUs on load; only instances and MIG modes change.
    &state.gpus[index as usize]
}

pub(super) fn gpu_state_mut(state: &mut StateFile, index: u32) -> &mut GpuState {
    &mut state.gpus[index as usize]
}

/// Writes `state` as JSON to `path` atomically (temp file, rename), without fsync: MIG
/// instances never survive a reboot, so neither need their emulation's records. A crashed plugin
/// still finds the last complete state.
pub(super) fn write_atomically(path: &Path, state: &StateFile) -> io::Result<()> {
    let bytes = serde_json::to_vec_pretty(state).map_err(io::Error::other)?;
    das_runtime::fs::write_atomically(path, &path.with_extension("json.tmp"), &bytes)
}

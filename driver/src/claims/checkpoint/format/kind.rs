//! How a recorded device's [`DeviceKind`] is written: `"gpu"` for a whole GPU, `"mig"` for a MIG
//! device (the values of the devices' `type` attribute, `das_api::attributes`), which is the
//! default and left out, so MIG devices serialize as in version 3 and their checksum is the same.

use serde::{Deserialize, Deserializer, Serializer};

use super::DeviceKind;
use das_api::attributes::{TYPE_GPU, TYPE_MIG};

/// Whether `kind` is the default, left out of the file.
pub(super) fn is_mig(kind: &DeviceKind) -> bool {
    *kind == DeviceKind::Mig
}

/// Writes `kind` as its name (serde `with`).
pub(super) fn serialize<S: Serializer>(kind: &DeviceKind, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(match kind {
        DeviceKind::Mig => TYPE_MIG,
        DeviceKind::WholeGpu => TYPE_GPU,
    })
}

/// Reads a kind's name; any other value is a bad shape (the file is moved aside, never
/// guessed at).
pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DeviceKind, D::Error> {
    let name = String::deserialize(d)?;
    match name.as_str() {
        TYPE_MIG => Ok(DeviceKind::Mig),
        TYPE_GPU => Ok(DeviceKind::WholeGpu),
        other => Err(serde::de::Error::unknown_variant(
            other,
            &[TYPE_MIG, TYPE_GPU],
        )),
    }
}

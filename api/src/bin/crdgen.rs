//! Writes the AllocationClaim CRD to `deploy/helm/das/files/allocationclaims.yaml` (or to the path given as
//! the first argument; `-` prints it). The unit test `committed_crd_is_current` fails when the
//! committed file is stale.

// Product functions stay under 80 code lines (clippy.toml); tests may be longer.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let yaml = das_api::allocation::crd_yaml();
    let default = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/helm/das/files/allocationclaims.yaml");
    match std::env::args().nth(1) {
        Some(p) if p == "-" => print!("{yaml}"),
        arg => {
            let path = arg.map(PathBuf::from).unwrap_or(default);
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(&path, yaml)?;
            eprintln!("wrote {}", path.display());
        }
    }
    Ok(())
}

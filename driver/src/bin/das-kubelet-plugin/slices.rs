//! What the plugin publishes, as far as its start-up decides it: the slices' options for the
//! API server's version and for this node (shareable devices need MPS), and the slices built
//! from the inventory before the health monitor's facts are added.

use anyhow::{Context, Result};
use das_driver::gpu::GpuInfo;
use das_driver::mps::MpsDaemons;
use das_driver::publish::binding;
use das_driver::publish::resource_slices::{self, ServerVersion, SliceOptions};
use k8s_openapi::api::resource::v1::ResourceSliceSpec;

use crate::args::{Args, shared_profiles};

/// What the slices hold for the API server's version (its layout, and the shareable devices of
/// --shared-profiles where it supports them; docs/design.md §7, "Shared slices"), and whether
/// carve before bind is on (--carve-before-bind on a server that serves binding conditions,
/// issue 34). When the flags ask for what the server cannot be given, the log says why.
pub(crate) async fn slice_options(
    client: &kube::Client,
    args: &Args,
) -> Result<(SliceOptions, bool)> {
    let info = client
        .apiserver_version()
        .await
        .context("read the API server version")?;
    let version = ServerVersion::from_info(&info);
    let (options, why_not) = SliceOptions::for_server(version, shared_profiles(args));
    if let Some(why) = why_not {
        tracing::warn!(
            profiles = ?args.shared_profiles.0, server = %info.git_version,
            "no shareable devices are published: {why}"
        );
    }
    let carve = args.carve_before_bind
        && match binding::binding_supported(version) {
            Ok(()) => true,
            Err(why) => {
                tracing::warn!(server = %info.git_version, "carve before bind is off: {why}");
                false
            }
        };
    Ok((options, carve))
}

/// `options` without shareable devices when this node cannot run MPS, which every share of a
/// slice needs (docs/design.md §7, "Shared slices"); the log says why.
pub(crate) fn unless_no_mps(mut options: SliceOptions, mps: &MpsDaemons) -> SliceOptions {
    if !options.shared.selectors.is_empty() && !mps.available() {
        tracing::warn!(
            profiles = ?options.shared.selectors,
            "no shareable devices are published: {}",
            das_driver::mps::supervisor::NO_BINARY
        );
        options.shared.selectors.clear();
    }
    options
}

/// The slices built from the inventory (without the health monitor's facts), with binding
/// conditions when carve before bind is on; logged.
pub(crate) fn base_slices(
    args: &Args,
    inventory: &[GpuInfo],
    options: SliceOptions,
    carve_before_bind: bool,
) -> Result<Vec<ResourceSliceSpec>> {
    let (layout, shared) = (options.layout, options.shared.selectors.clone());
    let desired = resource_slices::desired_resource_slices(&args.node_name, inventory, options)?;
    let desired = if carve_before_bind {
        binding::with_binding_conditions(desired)
    } else {
        desired
    };
    tracing::info!(
        slices = desired.len(),
        ?layout,
        ?shared,
        carve_before_bind,
        "publishing ResourceSlices"
    );
    Ok(desired.into_iter().map(|d| d.slice.spec).collect())
}

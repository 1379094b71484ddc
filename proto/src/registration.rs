//! The plugin side of kubelet plugin registration: answers `GetInfo` with a fixed
//! [`PluginInfo`] and hands `NotifyRegistrationStatus` to a callback. Serve it through
//! [`crate::authority::incoming`] (the kubelet's registration client sends an `:authority` h2
//! would reject).

use tonic::{Request, Response, Status};

use crate::pluginregistration::registration_server::{Registration, RegistrationServer};
use crate::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};

/// Called with the kubelet's verdict: `(registered, error)`.
pub type OnStatus = Box<dyn Fn(bool, String) + Send + Sync>;

/// The registration service of one plugin.
pub struct Registrar {
    info: PluginInfo,
    on_status: OnStatus,
}

impl Registrar {
    /// A registrar announcing `info`; `on_status` sees every NotifyRegistrationStatus.
    pub fn new(info: PluginInfo, on_status: OnStatus) -> RegistrationServer<Self> {
        RegistrationServer::new(Self { info, on_status })
    }
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        req: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let s = req.into_inner();
        (self.on_status)(s.plugin_registered, s.error);
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

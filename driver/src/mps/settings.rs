//! The node-wide settings of the MPS daemons, from the plugin's flags (pure): the protocol, the
//! shm backing, and how containers mount their pipe directory.

use super::shm::Shm;

/// The MPS control protocol the daemons speak (`--mps-protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// Protocol 2: one server per daemon, limits as the daemon's defaults
    /// (`set_default_*`); a share's own limits only in its clients' environment.
    #[default]
    V2,
    /// Protocol 3: a named server per MIG instance and a namespace per claim or share, whose limits the
    /// server applies whatever the client's environment says.
    V3,
}

/// The first driver major version whose MPS speaks protocol 3 (NVIDIA's MPS v3 interface page:
/// r615, CUDA 13.4).
pub(crate) const V3_DRIVER_MAJOR: u32 = 615;

/// `--mps-protocol`: a protocol, or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProtocolChoice {
    /// Protocol 3 where the driver's major version is [`V3_DRIVER_MAJOR`] or newer, else 2.
    #[default]
    Auto,
    /// This protocol, whatever the driver.
    Fixed(Protocol),
}

/// A `--mps-protocol` that is none of the valid ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--mps-protocol {0:?} is not valid; valid: auto (3 on driver r615 or newer, else 2), 2 or 3"
)]
pub struct BadProtocol(pub String);

impl ProtocolChoice {
    /// Reads `--mps-protocol`: `auto`, `2` or `3`.
    ///
    /// # Errors
    /// Anything else.
    pub fn parse(value: &str) -> Result<Self, BadProtocol> {
        match value.trim() {
            "auto" => Ok(Self::Auto),
            "2" => Ok(Self::Fixed(Protocol::V2)),
            "3" => Ok(Self::Fixed(Protocol::V3)),
            other => Err(BadProtocol(other.to_string())),
        }
    }

    /// The protocol for a node whose driver version is `driver_version` (`580.95.05`; `None` or
    /// unreadable: protocol 2, which every driver speaks).
    pub fn resolve(self, driver_version: Option<&str>) -> Protocol {
        match self {
            Self::Fixed(p) => p,
            Self::Auto => {
                let major = driver_version
                    .and_then(|v| v.split('.').next())
                    .and_then(|m| m.trim().parse::<u32>().ok());
                match major {
                    Some(m) if m >= V3_DRIVER_MAJOR => Protocol::V3,
                    _ => Protocol::V2,
                }
            }
        }
    }
}

/// Whether a container's pipe directory mount is read-only (`--mps-pipe-mount`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PipeMount {
    /// `ro` (the default): no container can create, rename or remove anything in it; it only
    /// connects to the sockets there (a connect needs write permission on the socket's inode,
    /// which a read-only mount does not take away).
    #[default]
    ReadOnly,
    /// `rw`, as NVIDIA's DRA driver mounts it: the escape hatch should an MPS client need to
    /// write there (not seen so far; docs/operations.md says how to check).
    ReadWrite,
}

impl PipeMount {
    /// Reads `--mps-pipe-mount`: `ro` or `rw`.
    ///
    /// # Errors
    /// Anything else, with what is valid.
    pub fn parse(value: &str) -> Result<Self, String> {
        match value.trim() {
            "ro" => Ok(Self::ReadOnly),
            "rw" => Ok(Self::ReadWrite),
            other => Err(format!(
                "--mps-pipe-mount {other:?} is not valid; valid: ro (the default: containers cannot change the MPS pipe directory) or rw (as NVIDIA's DRA driver mounts it)"
            )),
        }
    }
}

/// How the daemons of a node are run: the node-wide settings of the flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MpsSettings {
    /// The protocol they speak (`--mps-protocol`, resolved for the node's driver).
    pub protocol: Protocol,
    /// What backs their shm directories (`--mps-shm-size`).
    pub shm: Shm,
    /// How containers mount their pipe directory (`--mps-pipe-mount`).
    pub pipe_mount: PipeMount,
}

impl Default for MpsSettings {
    /// Protocol 2, plain shm directories (no mount: the library default, for tests that do not
    /// run as root; the plugin's flags default to a tmpfs), read-only pipe mounts.
    fn default() -> Self {
        Self {
            protocol: Protocol::V2,
            shm: Shm::Directory,
            pipe_mount: PipeMount::ReadOnly,
        }
    }
}

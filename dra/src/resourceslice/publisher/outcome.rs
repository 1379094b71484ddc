//! What one publish did ([`PublishStats`]), why it failed ([`PublishError`]), and the counts
//! over a publisher's life ([`PublishTotals`]).

/// Errors of one publish. Each names the node or slice and the cause.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The Node could not be read (its UID goes into the owner reference).
    #[error("looking up Node {node} for the ResourceSlice owner reference: {source}")]
    NodeLookup {
        /// Node name.
        node: String,
        /// API error.
        source: kube::Error,
    },
    /// The Node has no UID.
    #[error("Node {node} has no metadata.uid")]
    NodeWithoutUid {
        /// Node name.
        node: String,
    },
    /// Listing the node's slices failed.
    #[error("listing ResourceSlices with {selector}: {source}")]
    List {
        /// The field selector.
        selector: String,
        /// API error.
        source: kube::Error,
    },
    /// A desired slice selects nodes itself; the publisher manages node-local slices only.
    #[error(
        "desired slice #{index} of pool {pool} sets spec.{field}: only node-local slices \
         (spec.nodeName = the node) are published, because the publisher lists them by \
         spec.nodeName"
    )]
    NotNodeLocal {
        /// Index in the desired list.
        index: usize,
        /// Pool (node) name.
        pool: String,
        /// The offending field.
        field: &'static str,
    },
    /// Creating a slice failed.
    #[error("creating ResourceSlice {slice} (slice #{index} of pool {pool}): {source}")]
    Create {
        /// Slice name.
        slice: String,
        /// Index in the pool.
        index: usize,
        /// Pool name.
        pool: String,
        /// API error.
        source: kube::Error,
    },
    /// Updating a slice failed.
    #[error("updating ResourceSlice {slice} (slice #{index} of pool {pool}): {source}")]
    Update {
        /// Slice name.
        slice: String,
        /// Index in the pool.
        index: usize,
        /// Pool name.
        pool: String,
        /// API error.
        source: kube::Error,
    },
    /// Deleting an obsolete slice failed.
    #[error("deleting obsolete ResourceSlice {slice} ({reason}): {source}")]
    Delete {
        /// Slice name.
        slice: String,
        /// Why it is obsolete.
        reason: String,
        /// API error.
        source: kube::Error,
    },
}

/// What one publish did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishStats {
    /// Slices created.
    pub created: usize,
    /// Slices updated.
    pub updated: usize,
    /// Obsolete slices deleted (a slice already gone counts too).
    pub deleted: usize,
    /// Desired slices already up to date (no write).
    pub unchanged: usize,
    /// Written slices the server stored differently from what was sent (see
    /// [`crate::resourceslice::plan::Adopted`]).
    pub dropped_fields: usize,
    /// The node's devices are withdrawn: the API server drops shared counters
    /// (`DRAPartitionableDevices` off), so the pool was published empty
    /// ([`crate::resourceslice::gates`]).
    pub withdrawn: bool,
    /// Pool generation after the publish.
    pub generation: i64,
    /// `resourceSliceCount` after the publish.
    pub slice_count: usize,
}

impl PublishStats {
    /// API writes done.
    pub fn writes(&self) -> usize {
        self.created + self.updated + self.deleted
    }
}

/// Counters over the life of a [`super::Publisher`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishTotals {
    /// Publishes that succeeded.
    pub publishes: u64,
    /// Publishes that failed.
    pub failures: u64,
    /// Slices created.
    pub created: u64,
    /// Slices updated.
    pub updated: u64,
    /// Slices deleted.
    pub deleted: u64,
}

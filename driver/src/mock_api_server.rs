//! A mocked API server for the tests of the plugin's kube-client adapters (`claims::api_tests`,
//! `events::tests`): dra-plugin's (`dra_plugin::testing::api_server`), under the name the tests
//! have always used. A test lists the exact requests the adapter must make, in order, and the
//! answer to each; a request that is not the next one expected, or one more than expected, fails
//! the test. The real-cluster tests are in e2e/tests/plugin_*.rs.

pub(crate) use dra_plugin::testing::api_server::{ANY, ApiServer, Exchange, finished};

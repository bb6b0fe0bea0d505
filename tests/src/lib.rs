//! End-to-end and chaos tests that start real `permitd` processes.
//!
//! Not built yet: they arrive with the node, client and chaos issues.

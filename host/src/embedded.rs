//! The components built into the binary by `build.rs`, one per role that has a default.

use crate::roles::Role;

include!(concat!(env!("OUT_DIR"), "/embedded.rs"));

/// The embedded component of `role`, if the binary has one.
pub fn component(role: Role) -> Option<&'static [u8]> {
    EMBEDDED
        .iter()
        .find(|(name, _)| *name == role.name())
        .map(|(_, bytes)| *bytes)
}

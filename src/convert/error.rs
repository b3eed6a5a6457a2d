//! The error every step of a conversion returns: [`Error::Model`], prefixed `convert:`.

use crate::error::Error;

pub(super) fn bad(msg: impl Into<String>) -> Error {
    Error::Model(format!("convert: {}", msg.into()))
}

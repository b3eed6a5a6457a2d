//! Forward passes, one file per architecture family, each generic over [`crate::Backend`].

pub mod gemma3;

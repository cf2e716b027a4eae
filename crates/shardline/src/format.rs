//! The format of what Shardline keeps in a coordination store: every record says which version
//! of its layout wrote it, so that nodes of two Shardline versions share one store during a
//! rolling update.
//!
//! A record is `[0][version][readable from][postcard body]` (both numbers postcard varints):
//! - `version` is the layout its writer used;
//! - `readable from` is the oldest reader that can read it. A new version that only appends
//!   fields, and changes the meaning of none, keeps it: an older node reads the fields it knows
//!   and skips the rest. A version that changes what a field means raises it, and an older node
//!   then refuses the record with [`FormatError::TooNew`] rather than misread it.
//!
//! Records written before records carried versions (version 0 here) start with no header. No
//! such record starts with a zero byte and goes on: every one starts with a node name's length
//! (names are never empty), a term (never 0 in a stored shard map) or is a single varint (the
//! term counter), so the zero byte tells the two apart.
//!
//! What goes over the network is versioned once per connection instead (see
//! [`transport`](crate::transport)): its handshake agrees on the protocol both ends speak.
//!
//! The repository keeps golden encodings of every version of every record (`golden/`), and a
//! test reads each of them with today's code (the crate's `golden` tests).

use serde::de::DeserializeOwned;
use serde::Serialize;

/// A record Shardline stores, with the version of its layout.
pub trait Stored: Serialize + DeserializeOwned {
    /// What it is, for errors and logs.
    const WHAT: &'static str;
    /// The layout this build writes.
    const VERSION: u32;
    /// The oldest reader that can read what this build writes.
    const READABLE_FROM: u32;

    /// Reads the body of a record written at `version`, older than or equal to
    /// [`VERSION`](Self::VERSION). Every version so far (0, before the header, and 1) has one
    /// layout; a new layout adds its arm here, so records of every earlier version stay readable.
    fn read_version(version: u32, body: &[u8]) -> Result<Self, postcard::Error> {
        debug_assert!(version <= Self::VERSION);
        read_all(body)
    }
}

/// A stored record that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// Written by a newer Shardline in a layout this one cannot read.
    #[error(
        "the {what} was written in layout {version}, readable from {readable_from}; this build reads up to {ours}"
    )]
    TooNew {
        /// What the record is.
        what: &'static str,
        /// Its layout.
        version: u32,
        /// The oldest reader it allows.
        readable_from: u32,
        /// The newest layout this build reads.
        ours: u32,
    },
    /// The bytes are not a record of this kind.
    #[error("the {what} (layout {version}) cannot be read: {reason}")]
    Unreadable {
        /// What the record is.
        what: &'static str,
        /// The layout it claimed (0 without a header).
        version: u32,
        /// What the decoder said.
        reason: String,
    },
}

/// The stored form of `record`, header first.
pub fn encode<T: Stored>(record: &T) -> Result<Vec<u8>, postcard::Error> {
    encode_as::<T>(record)
}

/// The stored form of `value`, which serializes as a `T` does (a borrowed view of one, which
/// saves copying a large record to write it).
pub fn encode_as<T: Stored>(value: &impl Serialize) -> Result<Vec<u8>, postcard::Error> {
    let mut out = vec![0];
    out.extend(postcard::to_allocvec(&(T::VERSION, T::READABLE_FROM))?);
    postcard::to_extend(value, out)
}

/// Reads a stored record of any version this build knows, or of a newer one that allows it.
pub fn decode<T: Stored>(bytes: &[u8]) -> Result<T, FormatError> {
    let unreadable =
        |version: u32, e: postcard::Error| FormatError::Unreadable { what: T::WHAT, version, reason: e.to_string() };
    let Some(rest) = bytes.strip_prefix(&[0]).filter(|r| !r.is_empty()) else {
        return T::read_version(0, bytes).map_err(|e| unreadable(0, e));
    };
    let ((version, readable_from), body) =
        postcard::take_from_bytes::<(u32, u32)>(rest).map_err(|e| unreadable(0, e))?;
    if version <= T::VERSION {
        return T::read_version(version, body).map_err(|e| unreadable(version, e));
    }
    if readable_from > T::VERSION {
        return Err(FormatError::TooNew { what: T::WHAT, version, readable_from, ours: T::VERSION });
    }
    // A newer layout that only appended fields: ours is its prefix.
    postcard::take_from_bytes::<T>(body).map(|(t, _)| t).map_err(|e| unreadable(version, e))
}

/// Decodes `body` as a whole: bytes left over mean it is not a record of this layout.
pub fn read_all<T: DeserializeOwned>(body: &[u8]) -> Result<T, postcard::Error> {
    match postcard::take_from_bytes(body)? {
        (t, []) => Ok(t),
        _ => Err(postcard::Error::DeserializeBadEncoding),
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Pair {
        name: String,
        count: u64,
    }

    impl Stored for Pair {
        const WHAT: &'static str = "pair";
        const VERSION: u32 = 1;
        const READABLE_FROM: u32 = 1;
    }

    /// What a later build would write: the same fields, one more at the end.
    #[derive(Serialize)]
    struct PairWithMore {
        name: String,
        count: u64,
        more: Vec<u32>,
    }

    fn pair() -> Pair {
        Pair { name: "a".into(), count: 300 }
    }

    fn later(readable_from: u32) -> Vec<u8> {
        let mut out = vec![0];
        out.extend(postcard::to_allocvec(&(2u32, readable_from)).unwrap());
        let more = PairWithMore { name: "a".into(), count: 300, more: vec![7, 8] };
        postcard::to_extend(&more, out).unwrap()
    }

    #[test]
    fn a_record_reads_back_and_so_does_one_without_a_header() {
        let stored = encode(&pair()).unwrap();
        assert_eq!(&stored[..3], &[0, 1, 1]);
        assert_eq!(decode::<Pair>(&stored), Ok(pair()));
        assert_eq!(decode::<Pair>(&postcard::to_allocvec(&pair()).unwrap()), Ok(pair()));
    }

    /// An older node reads a newer record that only appended fields, and refuses one that says
    /// it must not read it.
    #[test]
    fn a_newer_layout_is_read_when_it_allows_it_and_refused_when_not() {
        assert_eq!(decode::<Pair>(&later(1)), Ok(pair()));
        assert_eq!(
            decode::<Pair>(&later(2)),
            Err(FormatError::TooNew { what: "pair", version: 2, readable_from: 2, ours: 1 })
        );
    }

    #[test]
    fn bytes_left_over_or_missing_are_errors_never_a_record() {
        let mut stored = encode(&pair()).unwrap();
        stored.push(9);
        assert!(matches!(decode::<Pair>(&stored), Err(FormatError::Unreadable { version: 1, .. })));
        let stored = encode(&pair()).unwrap();
        assert!(matches!(decode::<Pair>(&stored[..4]), Err(FormatError::Unreadable { .. })));
        assert!(matches!(decode::<Pair>(&[]), Err(FormatError::Unreadable { version: 0, .. })));
        assert!(matches!(decode::<Pair>(&[0, 0x80]), Err(FormatError::Unreadable { .. })));
    }
}
